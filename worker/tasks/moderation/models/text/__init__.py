"""The text model (MiniLM sentence embeddings): a job's text, scored against each label's
descriptions."""
