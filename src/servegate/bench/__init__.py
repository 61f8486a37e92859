"""Measurements and probes against a running OpenAI-compatible server."""
