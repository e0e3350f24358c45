"""worker/tasks/moderation/engine_setup."""
