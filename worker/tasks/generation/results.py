"""Results: PNG-encode rows, assemble one result per job, move images to the blob store when
the record would exceed the results topic's limit, and write moderation into each version.

Offloading is all-or-nothing per result: either every published image is inline (``png``) or
every one is a reference (``blob``), so a consumer never has to merge the two within one job.
An image moderation blocked is never published: no png, no blob (worker.tasks.generation.safety).

Versions. A v2 result carries each image's check (verdict, scores, rule) and the prompt's, and a
blocked prompt is status ``blocked``. v1 has none of these fields, and its schema stays as it
was: :func:`in_version` leaves blocked images out of a v1 result and says so in ``error`` (a
field v1 allows with any status), and answers a blocked prompt, or a job all of whose images
were blocked, ``rejected`` ("refused by policy", v1's own meaning) with the reason in ``error``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from worker.exceptions import Transient
from worker.tasks.generation.blobs import BlobStore, blob_key
from worker.wire.generation_codec import encode_generation_result
from worker.wire.generation_jobs import BlobRef, Check, GeneratedImage, GenerationResult
from worker.wire.moderation_jobs import Status
from worker.wire.versions import V1


def fit_result(result: GenerationResult, limit: int, blobs: BlobStore,
               clock: Callable[[], float]) -> GenerationResult:
    """``result`` unchanged if its encoding fits ``limit`` bytes, else with images in blobs."""
    if len(encode_generation_result(result)) <= limit:
        return result
    started = clock()
    images = []
    for im in result.images:
        if im.png is None:  # withheld by moderation: nothing to store
            images.append(im)
            continue
        images.append(replace(im, png=None, blob=store(blobs, result.id, im.index, im.seed,
                                                       im.png, "blob store")))
    timings = dict(result.timings_ms)
    timings["blob"] = (clock() - started) * 1e3
    timings["total"] = timings.get("total", 0.0) + timings["blob"]
    return replace(result, images=tuple(images), timings_ms=timings)


def store(blobs: BlobStore, job_id: str, index: int, seed: int, png: bytes, what: str
          ) -> BlobRef:
    try:
        return blobs.put(blob_key(job_id, index, seed, png), png, "image/png")
    except Exception as exc:
        # Never the job's fault (its images are made): an outage of the store, a full disk, a
        # revoked credential. The batch waits and runs again (worker.tasks.batched).
        raise Transient(f"{what}: {type(exc).__name__}: {exc}") from exc


def images_for(pngs: dict[tuple[int, int], bytes], job_pos: int, seeds: list[int],
               width: int, height: int, checks: dict[tuple[int, int], Check] | None = None,
               quarantined: dict[tuple[int, int], BlobRef] | None = None
               ) -> tuple[GeneratedImage, ...]:
    """The job's images; a blocked one (its check's verdict) has no png."""
    checks, quarantined = checks or {}, quarantined or {}
    out = []
    for i, s in enumerate(seeds):
        tag = (job_pos, i)
        im = GeneratedImage(index=i, seed=s, width=width, height=height, check=checks.get(tag),
                            quarantine=quarantined.get(tag))
        out.append(im if im.withheld else replace(im, png=pngs[tag]))
    return tuple(out)


def in_version(result: GenerationResult) -> GenerationResult:
    """``result`` as its job's version answers it (see the module's docstring)."""
    if result.schema_version != V1:
        return result
    if result.status is Status.BLOCKED:
        check = result.prompt_check
        assert check is not None
        return replace(result, status=Status.REJECTED, prompt_check=None, images=(),
                       error=f"prompt blocked by moderation: {check.rule} ({check.reason})")
    withheld = [im for im in result.images if im.withheld]
    shown = tuple(replace(im, check=None, quarantine=None)
                  for im in result.images if not im.withheld)
    out = replace(result, images=shown, prompt_check=None)
    if not withheld:
        return out
    rules = sorted({im.check.rule for im in withheld if im.check is not None})
    note = (f"images {[im.index for im in withheld]} withheld by moderation: "
            f"{', '.join(rules)}")
    if not shown:
        return replace(out, status=Status.REJECTED, error=note)
    return replace(out, error=note)
