"""worker/tasks."""
