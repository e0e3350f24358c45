"""worker/tools/replay/compare."""
