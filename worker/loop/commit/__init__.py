"""worker/loop/commit."""
