"""The box's GPUs: their health (docs/gpu-health.md)."""
