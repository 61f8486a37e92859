"""Self-hosted CI runners on the serving box: provisioning and job hooks."""
