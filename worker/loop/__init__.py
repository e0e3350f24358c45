"""worker/loop."""
