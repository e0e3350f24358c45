"""worker/tasks/moderation/images."""
