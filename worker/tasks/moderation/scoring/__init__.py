"""worker/tasks/moderation/scoring."""
