"""worker/wire."""
