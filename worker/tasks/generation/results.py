"""Results: PNG-encode rows, assemble one result per job, move images to the blob store when
the record would exceed the results topic's limit.

Offloading is all-or-nothing per result: either every image is inline (``png``) or every image
is a reference (``blob``), so a consumer never has to merge the two within one job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from worker.exceptions import Transient
from worker.tasks.generation.blobs import BlobStore, blob_key
from worker.wire.generation_codec import encode_generation_result
from worker.wire.generation_jobs import GeneratedImage, GenerationResult


def fit_result(result: GenerationResult, limit: int, blobs: BlobStore,
               clock: Callable[[], float]) -> GenerationResult:
    """``result`` unchanged if its encoding fits ``limit`` bytes, else with images in blobs."""
    if len(encode_generation_result(result)) <= limit:
        return result
    started = clock()
    images = []
    for im in result.images:
        assert im.png is not None
        try:
            ref = blobs.put(blob_key(result.id, im.index, im.seed, im.png), im.png,
                            "image/png")
        except Exception as exc:
            # Never the job's fault (its images are made): an outage of the store, a full
            # disk, a revoked credential. The batch waits and runs again (worker.tasks.batched).
            raise Transient(f"blob store: {type(exc).__name__}: {exc}") from exc
        images.append(replace(im, png=None, blob=ref))
    timings = dict(result.timings_ms)
    timings["blob"] = (clock() - started) * 1e3
    timings["total"] = timings.get("total", 0.0) + timings["blob"]
    return replace(result, images=tuple(images), timings_ms=timings)


def images_for(pngs: dict[tuple[int, int], bytes], job_pos: int, seeds: list[int],
               width: int, height: int) -> tuple[GeneratedImage, ...]:
    return tuple(GeneratedImage(index=i, seed=s, width=width, height=height,
                                png=pngs[(job_pos, i)]) for i, s in enumerate(seeds))
