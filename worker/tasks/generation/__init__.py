"""Text-to-image generation jobs: wire codec, samplers, denoising loop, PNG results, blobs.

The task (:class:`worker.tasks.generation.task.GenerationTask`) has the moderation task's shape:
validate at intake (``JobRejected`` subclasses go to the DLQ), ``submit(batch)`` returns a
future of outcomes, ``warm_up`` and ``close``.
"""
