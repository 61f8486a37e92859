"""GPU extension builds of a stack and the artifacts they leave in a release."""
