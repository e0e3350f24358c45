"""CLIP: a job's image zero-shot against each label's prompts, and against its caption."""
