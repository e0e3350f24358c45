"""The flood corpus (tests/harness/faults/corpus.py): each class is rejected with the reason the
flood test expects, by the same checks the worker applies, without a broker."""

from __future__ import annotations

import collections

import pytest

from tests.harness.faults import FLOOD_LIMITS, BadJob, malformed_corpus
from worker.config import load_config
from worker.exceptions import JobRejected, OversizedMessage, SchemaViolation
from worker.tasks.moderation.images.cpu import ImageLimits, decode_image
from worker.tasks.moderation.results import no_image
from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job


def _reason(value: bytes | None) -> str:
    cfg = load_config(None, limits=FLOOD_LIMITS)
    try:
        # The worker's intake order (worker.loop.worker.Worker._accept, then the decode pool).
        if value is None:
            raise SchemaViolation("tombstone")
        if len(value) > cfg.limits.max_message_bytes:
            raise OversizedMessage("oversized")
        job = decode_moderation_job(value, DecodeLimits(cfg.limits.max_image_bytes,
                                                        cfg.limits.max_text_chars))
        if job.policy not in cfg.model.policies:
            raise JobRejected("policy", reason="unknown_policy")
        if job.image is None:
            raise no_image(job)
        decode_image(job.image, ImageLimits(cfg.limits.max_image_pixels,
                                            cfg.limits.max_image_side))
    except JobRejected as exc:
        return exc.reason
    return "accepted"


@pytest.fixture(scope="module")
def corpus() -> list[BadJob]:
    return malformed_corpus(2000, seed=1)


def test_corpus_has_the_issue_s_twelve_classes_and_more(corpus: list[BadJob]) -> None:
    classes = {b.klass for b in corpus}
    assert len(classes) >= 12
    assert {"not_msgpack", "truncated_msgpack", "wrong_types", "missing_fields", "unknown_v",
            "truncated_jpeg", "png_bomb", "header_50k_x_50k", "zero_byte_image", "huge_text",
            "oversized_message", "invalid_utf8"} <= classes
    assert len({b.key for b in corpus}) == len(corpus) == 2000


def test_every_corpus_job_is_rejected_with_its_expected_reason(corpus: list[BadJob]) -> None:
    wrong: collections.Counter[tuple[str, str]] = collections.Counter()
    for b in corpus:
        got = _reason(b.value)
        if got != b.reason:
            wrong[(b.klass, got)] += 1
    assert not wrong, wrong
