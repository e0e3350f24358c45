"""Checks a decoded job against this worker's configuration (not the contract).

The contract allows any size from 64 to 2048 in steps of 8, up to 150 steps and 64 images; a
worker serves only the resolutions it has engines for, its configured step range and its
configured images per job. Each refusal names its own DLQ reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.exceptions import JobRejected
from worker.wire.generation_jobs import GenerationJob


class UnsupportedSize(JobRejected):
    """The job's width x height matches no configured generation profile."""

    reason = "unsupported_size"


class UnsupportedSteps(JobRejected):
    """The job's step count is outside the configured range."""

    reason = "unsupported_steps"


class TooManyImages(JobRejected):
    """The job asks for more images than a job may have on this worker."""

    reason = "too_many_images"


@dataclass(frozen=True)
class IntakeRules:
    sizes: frozenset[tuple[int, int]]  # (width, height)
    min_steps: int
    max_steps: int
    max_images: int

    def check(self, job: GenerationJob) -> None:
        if (job.width, job.height) not in self.sizes:
            known = ", ".join(f"{w}x{h}" for w, h in sorted(self.sizes))
            raise UnsupportedSize(f"size {job.width}x{job.height} matches no profile "
                                  f"(configured: {known})")
        if not self.min_steps <= job.steps <= self.max_steps:
            raise UnsupportedSteps(f"steps {job.steps} outside the configured range "
                                   f"[{self.min_steps}, {self.max_steps}]")
        if job.num_images > self.max_images:
            raise TooManyImages(f"num_images {job.num_images} exceeds this worker's limit "
                                f"{self.max_images}")
