"""The client path through a real broker: the production loop with an engine that answers at once,
against a minimal loop; client settings; Tansu for machines without Java."""
