"""Text-to-image generation jobs: wire codec, samplers, denoising loop, PNG results, blobs.

The task (:class:`worker.tasks.generation.task.GenerationTask`) is a
:class:`worker.tasks.batched.BatchedTask`, like moderation: validate at intake
(``JobRejected`` subclasses go to the DLQ), ``submit(batch)`` returns a future of outcomes,
``warm_up`` and ``close``. :func:`worker.tasks.generation.factory.generation_task` builds the
one a worker serves (``processing.task = "generation"``).
"""
