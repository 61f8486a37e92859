"""The serving engine as a service: launch spec, service managers, health, provenance."""
