"""Text-to-image jobs served by the worker loop against the real broker.

A generation worker (``processing.task = "generation"``) reads ``generation.topics`` with its own
consumer group; the moderation topics of its config point at topics that do not exist, so the
tests also prove it never touches them. Engines: the tiny random-initialised SD architecture,
torch fp32 on the CPU at 64x64 (8x8 latents), built once per module into a temporary engine
cache. Cases: a job with N variants, determinism, every invalid-job class in the DLQ, blob
offload of a result over ``generation.results_max_bytes``, exactly-once, and ``trt-worker
generate`` sending a job and saving its images.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import confluent_kafka as ck
import msgpack
import numpy as np
import pytest
from PIL import Image

from tests.harness.faults import key_counts, read_all
from tests.harness.workers import (
    ThreadedWorker,
    Topics,
    committed,
    end_offsets,
    fresh_topics,
    keys_of,
    produce_records,
    read_topic,
    worker_config,
)
from worker.config import WorkerConfig
from worker.wire.generation_codec import default_seed, encode_generation_job
from worker.wire.moderation_codec import decode_result

MISSING = [m for m in ("torch", "tokenizers", "safetensors") if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(MISSING), reason=f"needs the gen extra ({', '.join(MISSING)} "
                                             "missing): pip install 'kafka-trt-worker[gen]'"),
]

SIDE = 64
MAX_STEPS = 8
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]


@pytest.fixture(scope="module")
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gen-engines")


def gen_config(bootstrap: str, topics: Topics, engine_cache: Path, blob_dir: Path,
               generation: dict[str, Any] | None = None, **overrides: Any) -> WorkerConfig:
    unused = [f"moderation-{kind}-unused-{uuid.uuid4().hex[:8]}" for kind in ("jobs", "r", "d")]
    g: dict[str, Any] = {
        "random_weights": "tiny", "backend": "torch", "device": "cpu",
        "sizes": [{"width": SIDE, "height": SIDE}], "text_batch_sizes": [2, 4, 8],
        "unet_batch_sizes": [2, 4, 8], "vae_batch_sizes": [1, 2, 4], "max_steps": MAX_STEPS,
        "max_images_per_job": 4, "png_threads": 2, "blob": {"local_dir": str(blob_dir)},
        "topics": {"jobs": topics.jobs, "results": topics.results, "dlq": topics.dlq},
    } | (generation or {})
    # The moderation topics (``topics.*``) name topics that do not exist; only the group is ours.
    return worker_config(
        bootstrap, Topics(*unused, topics.group),
        processing={"task": "generation"} | overrides.pop("processing", {}),
        engines={"cache_dir": str(engine_cache)}, batch={"max_delay_ms": 20},
        model={"intra_op_threads": 1}, generation=g, **overrides)


def job(job_id: str, **fields: Any) -> Record:
    doc = {"prompt": "a red car", "width": SIDE, "height": SIDE, "steps": 3} | fields
    return job_id.encode(), encode_generation_job(job_id, **doc), None


def raw(job_id: str, **fields: Any) -> Record:
    """A job that bypasses the encoder's validation (to reach the worker's DLQ)."""
    doc = {"v": 1, "id": job_id, "prompt": "a red car", "width": SIDE, "height": SIDE,
           "steps": 3} | fields
    return job_id.encode(), msgpack.packb(doc, use_bin_type=True), None


def results_for(bootstrap: str, topic: str, ids: set[str]) -> dict[str, ck.Message]:
    msgs = read_topic(bootstrap, topic, until=lambda m: ids <= set(keys_of(m)), timeout=120)
    return {m.key().decode(): m for m in msgs}


def pngs(result: dict[str, Any]) -> list[bytes]:
    return [bytes(im["png"]) for im in result["images"]]


def decoded(png: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(png))
    im.load()
    return im


@pytest.fixture
def topics(kafka_bootstrap: str) -> Topics:
    return fresh_topics(kafka_bootstrap, partitions=2)


@pytest.fixture
def serve(kafka_bootstrap: str, topics: Topics, engine_cache: Path,
          tmp_path: Path) -> Iterator[Any]:
    def start(generation: dict[str, Any] | None = None, **overrides: Any) -> ThreadedWorker:
        return ThreadedWorker(gen_config(kafka_bootstrap, topics, engine_cache,
                                         tmp_path / "blobs", generation, **overrides))

    yield start


@pytest.mark.timeout(180)
def test_a_job_with_two_variants_gets_one_result_with_two_pngs_and_their_seeds(
    kafka_bootstrap: str, topics: Topics, serve: Any
) -> None:
    records = [job("two", num_images=2, seed=41, scheduler="euler"),
               job("unseeded", num_images=2, scheduler="ddim", steps=2),
               job("late", num_images=2, deadline_ms=1)]
    with serve():
        produce_records(kafka_bootstrap, topics.jobs, records)
        got = results_for(kafka_bootstrap, topics.results, {"two", "unseeded", "late"})
    assert key_counts(read_all(kafka_bootstrap, topics.results, idle_s=1)) == {
        "two": 1, "unseeded": 1, "late": 1}, "one result per job"
    assert read_all(kafka_bootstrap, topics.dlq, idle_s=0.5) == []
    msg = got["two"]
    headers = dict(msg.headers() or [])
    assert headers["ktw.schema"] == b"generation-result/v1"
    assert headers["ktw.model"] == b"tiny-random-s0"
    assert headers["ktw.engine"]  # the UNet's engine hash
    r = decode_result(msg.value())
    assert (r["v"], r["id"], r["status"], r["random_weights"]) == (1, "two", "ok", True)
    assert r["model_id"] == "tiny-random-s0"
    assert set(r["engine_hashes"]) == {"text_encoder", "unet", "vae"}
    assert r["source"]["topic"] == topics.jobs and r["source"]["offset"] >= 0
    assert {"queue", "text", "denoise", "vae", "png", "total"} <= set(r["timings_ms"])
    assert [(im["index"], im["seed"], im["width"], im["height"]) for im in r["images"]] == [
        (0, 41, SIDE, SIDE), (1, 42, SIDE, SIDE)]
    first, second = pngs(r)
    for png in (first, second):
        im = decoded(png)
        assert (im.format, im.mode, im.size) == ("PNG", "RGB", (SIDE, SIDE))
        assert np.asarray(im).std() > 0, "drawn, not a constant image"
    assert first != second, "variants use different seeds"
    # No seed in the job: image 0 uses the first 4 bytes of SHA-256(id), image i that plus i.
    u = decode_result(got["unseeded"].value())
    s0 = default_seed("unseeded")
    assert [im["seed"] for im in u["images"]] == [s0, (s0 + 1) % 2**32]
    assert u["status"] == "ok" and len(pngs(u)) == 2
    # Past its deadline at intake: answered without images, never computed.
    late = decode_result(got["late"].value())
    assert (late["status"], late["images"]) == ("expired", [])
    assert "denoise" not in late["timings_ms"] and "deadline" in late["error"]


@pytest.mark.timeout(180)
def test_same_prompt_seed_scheduler_and_steps_give_byte_identical_pngs(
    kafka_bootstrap: str, topics: Topics, serve: Any
) -> None:
    same = {"prompt": "a lighthouse", "seed": 7, "scheduler": "euler_a", "steps": 4}
    with serve():
        # Sent apart, so each runs alone in its batch: the same batch shape both times.
        for key in ("first", "again"):
            produce_records(kafka_bootstrap, topics.jobs, [job(key, **same)])
            results_for(kafka_bootstrap, topics.results, {key})
        # Sent together: usually one batch of two jobs (a different UNet batch size).
        produce_records(kafka_bootstrap, topics.jobs, [job("mixed", **same),
                                               job("other-seed", **(same | {"seed": 8}))])
        got = results_for(kafka_bootstrap, topics.results,
                          {"first", "again", "mixed", "other-seed"})
    first, again, mixed, other = (decode_result(got[k].value())
                                  for k in ("first", "again", "mixed", "other-seed"))
    assert {r["status"] for r in (first, again, mixed, other)} == {"ok"}
    assert pngs(first) == pngs(again)
    assert pngs(other) != pngs(first)
    # Across batch sizes the kernels round differently: at most one level per channel.
    a, m = (np.asarray(decoded(pngs(r)[0])).astype(int) for r in (first, mixed))
    assert np.abs(a - m).max() <= 1 and np.mean(a != m) < 0.01


@pytest.mark.timeout(180)
def test_invalid_jobs_go_to_the_generation_dlq_with_their_reason_and_nothing_is_lost(
    kafka_bootstrap: str, topics: Topics, serve: Any
) -> None:
    bad: dict[str, tuple[Record, str]] = {
        "bad-scheduler": (raw("bad-scheduler", scheduler="pndm"), "schema"),
        "bad-size": (raw("bad-size", width=512, height=512), "unsupported_size"),
        "bad-steps": (raw("bad-steps", steps=MAX_STEPS + 1), "unsupported_steps"),
        "bad-steps-zero": (raw("bad-steps-zero", steps=0), "schema"),
        "bad-prompt": (raw("bad-prompt", prompt="  "), "schema"),
        "bad-too-many": (raw("bad-too-many", num_images=5), "too_many_images"),
        "bad-version": (raw("bad-version", v=3), "unsupported_version"),
        "bad-not-msgpack": ((b"bad-not-msgpack", b"\xc1 not msgpack", None), "not_msgpack"),
    }
    records = [rec for rec, _ in bad.values()] + [job("good-after", num_images=1)]
    with serve() as s:
        produce_records(kafka_bootstrap, topics.jobs, records)
        dead = read_topic(kafka_bootstrap, topics.dlq,
                          until=lambda m: set(bad) <= set(keys_of(m)), timeout=120)
        got = results_for(kafka_bootstrap, topics.results, {"good-after"})
        assert s.thread.is_alive(), "the worker keeps running after bad input"
    assert sorted(keys_of(dead)) == sorted(bad)
    sent = {key: value for key, value, _ in records}
    for msg in dead:
        key = msg.key().decode()
        h = {k: (v or b"").decode() for k, v in msg.headers() or []}
        assert h["ktw.dlq.error.reason"] == bad[key][1], (key, h["ktw.dlq.error.message"])
        assert h["ktw.dlq.source.topic"] == topics.jobs
        assert msg.value() == sent[key.encode()], "original value untouched"
    assert decode_result(got["good-after"].value())["status"] == "ok"
    assert key_counts(read_all(kafka_bootstrap, topics.results, idle_s=1)) == {"good-after": 1}
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 2) == end_offsets(
        kafka_bootstrap, topics.jobs, 2)


@pytest.mark.timeout(180)
def test_a_result_over_results_max_bytes_carries_blob_references(
    kafka_bootstrap: str, topics: Topics, serve: Any, tmp_path: Path
) -> None:
    with serve(generation={"results_max_bytes": 4096}):
        produce_records(kafka_bootstrap, topics.jobs, [job("big", num_images=2, seed=3)])
        got = results_for(kafka_bootstrap, topics.results, {"big"})
    value = got["big"].value()
    assert len(value) <= 4096
    r = decode_result(value)
    assert r["status"] == "ok" and "blob" in r["timings_ms"]
    assert [(im["index"], im["seed"]) for im in r["images"]] == [(0, 3), (1, 4)]
    blob_dir = (tmp_path / "blobs").resolve()
    for im in r["images"]:
        assert "png" not in im
        ref = im["blob"]
        uri = urlparse(ref["uri"])
        assert uri.scheme == "file"
        path = Path(unquote(uri.path))
        assert path.is_file() and path.is_relative_to(blob_dir)
        data = path.read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (ref["bytes"], ref["sha256"])
        assert ref["content_type"] == "image/png"
        assert decoded(data).size == (SIDE, SIDE)


@pytest.mark.timeout(180)
def test_exactly_once_answers_a_job_once_for_a_read_committed_reader(
    kafka_bootstrap: str, topics: Topics, serve: Any
) -> None:
    with serve(processing={"guarantee": "exactly-once"},
               kafka={"instance_id": f"gen-{uuid.uuid4().hex[:6]}"}) as s:
        produce_records(kafka_bootstrap, topics.jobs, [job("eos", num_images=2, seed=5),
                                               raw("eos-bad", scheduler="nope")])
        # Visible only once its transaction commits: read_topic reads read_committed.
        got = results_for(kafka_bootstrap, topics.results, {"eos"})
        totals = s.worker.guarantee_totals()
    assert totals["txn_commits"] >= 1 and totals["txn_aborts"] == 0, totals
    results = read_all(kafka_bootstrap, topics.results, idle_s=1)
    assert key_counts(results) == {"eos": 1}
    assert key_counts(read_all(kafka_bootstrap, topics.dlq, idle_s=0.5)) == {"eos-bad": 1}
    raw_results = read_all(kafka_bootstrap, topics.results, isolation="read_uncommitted",
                           idle_s=0.5)
    assert key_counts(raw_results) == {"eos": 1}, "nothing produced twice, even uncommitted"
    r = decode_result(got["eos"].value())
    assert r["status"] == "ok" and [im["seed"] for im in r["images"]] == [5, 6]
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 2) == end_offsets(
        kafka_bootstrap, topics.jobs, 2)


@pytest.mark.timeout(180)
def test_trt_worker_generate_sends_a_job_and_saves_its_images(
    kafka_bootstrap: str, topics: Topics, serve: Any, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from worker.tools.cli import app

    out = tmp_path / "out"
    env = {"KTW_GENERATION__TOPICS__JOBS": topics.jobs,
           "KTW_GENERATION__TOPICS__RESULTS": topics.results,
           "KTW_GENERATION__TOPICS__DLQ": topics.dlq, "KTW_LOG__LEVEL": "WARNING"}
    with serve():
        started = time.monotonic()
        res = CliRunner().invoke(app, [
            "generate", "a blue boat", "-b", kafka_bootstrap, "--n", "2", "--width", str(SIDE),
            "--height", str(SIDE), "--steps", "2", "--scheduler", "ddim", "--seed", "11",
            "--id", "cli-job", "--out", str(out), "--timeout", "90"], env=env)
        took = time.monotonic() - started
        assert res.exit_code == 0, res.output
        bad = CliRunner().invoke(app, [
            "generate", "a blue boat", "-b", kafka_bootstrap, "--width", "512", "--height",
            "512", "--steps", "2", "--id", "cli-bad", "--wait", "--timeout", "60"], env=env)
    assert took < 60
    assert "cli-job" in res.output and "ok" in res.output
    files = sorted(p.name for p in out.iterdir())
    assert files == ["cli-job-0-11.png", "cli-job-1-12.png"]
    assert all(decoded((out / f).read_bytes()).size == (SIDE, SIDE) for f in files)
    assert bad.exit_code == 1 and "unsupported_size" in bad.output, bad.output
