"""Text moderation and CLIP engines: MiniLM per token profile, CLIP's image tower."""
