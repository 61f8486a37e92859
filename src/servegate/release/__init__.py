"""Promote, rollback, the gate, release records and the host's release state."""
