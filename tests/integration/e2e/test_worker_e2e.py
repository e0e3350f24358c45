"""N jobs in, N results out, offsets committed, scores equal a direct onnxruntime call."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from engines.models.open_nsfw import bundled_onnx_path
from tests.harness.workers import (
    ThreadedWorker,
    committed,
    end_offsets,
    fresh_topics,
    keys_of,
    read_topic,
    worker_config,
)
from worker.bundled import samples_dir
from worker.tasks.moderation.images.cpu import decode_image
from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw
from worker.tools.produce import produce_folder
from worker.wire.moderation_codec import decode_result

pytestmark = pytest.mark.integration
N = 60


def _direct_scores() -> dict[str, float]:
    """open_nsfw nsfw score per sample file from a plain onnxruntime session."""
    files = sorted(p for p in samples_dir().iterdir() if p.suffix != ".md")
    x = np.stack([preprocess_open_nsfw(decode_image(p.read_bytes())) for p in files])
    sess = ort.InferenceSession(str(bundled_onnx_path()), providers=["CPUExecutionProvider"])
    out = sess.run(["outputs"], {"input:0": x})[0]
    return {p.stem: float(row[1]) for p, row in zip(files, out, strict=True)}


def test_n_jobs_in_n_results_out_and_offsets_committed(kafka_bootstrap: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=3)
    cfg = worker_config(kafka_bootstrap, topics, batch={"max_batch_size": 8})
    sent = produce_folder(cfg, samples_dir(), count=N, prefix="e2e-")
    want = {s.id for s in sent}

    with ThreadedWorker(cfg):
        msgs = read_topic(kafka_bootstrap, topics.results,
                          until=lambda m: want <= set(keys_of(m)))
    keys = keys_of(msgs)
    assert set(keys) == want
    assert len(keys) == N, "no duplicates expected without a crash"

    direct = _direct_scores()
    by_id = {s.id: s for s in sent}
    for msg in msgs:
        headers = dict(msg.headers() or [])
        assert headers["ktw.schema"] == b"moderation-result/v1"
        assert headers["ktw.model"] == b"open_nsfw"
        result = decode_result(msg.value())
        assert result["id"] == msg.key().decode()
        assert result["status"] == "ok"
        assert result["verdict"] == "allow"
        assert headers["ktw.engine"].decode() == result["engine_hash"]
        assert result["source"]["topic"] == topics.jobs
        stem = by_id[result["id"]].path.stem
        np.testing.assert_allclose(result["scores"]["nsfw"], direct[stem], rtol=1e-5, atol=1e-7)
        assert set(result["timings_ms"]) == {"queue", "decode", "infer", "total"}

    # After a clean drain every partition is committed up to its end.
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 3) == end_offsets(
        kafka_bootstrap, topics.jobs, 3
    )
