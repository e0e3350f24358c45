"""worker/tools."""
