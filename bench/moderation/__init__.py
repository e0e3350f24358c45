"""open_nsfw image moderation: the engine alone, the GPU stages, the pipeline and the worker end
to end through Kafka; the CPU int8 engine's drift."""
