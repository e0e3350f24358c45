"""worker/tasks/moderation."""
