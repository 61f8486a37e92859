"""One module per command; each exposes a function that returns the exit code."""
