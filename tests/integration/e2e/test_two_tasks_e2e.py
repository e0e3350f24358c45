"""One `trt-worker run` process serving both tasks (``processing.task =
"moderation,generation"``) through the real broker, under both delivery guarantees: a
moderation job (open_nsfw on ONNX Runtime) and a generation job (the tiny random SD engines,
torch fp32 on the CPU) are answered by the same process, each task's offsets committed in its
own consumer group (``<group_id>`` and ``<group_id>-generation``); one port says ready only
once both loops are, with per-task metrics; SIGTERM stops both (exit 0).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from tests.harness.faults import key_counts, read_all
from tests.harness.workers import (
    WorkerProcess,
    committed,
    end_offsets,
    fresh_topics,
    produce_records,
    worker_config,
    worker_env,
)
from tests.integration.e2e.test_generation_e2e import (  # noqa: F401 - fixture, used by name
    MISSING,
    SIDE,
    engine_cache,
    job,
    results_for,
)
from tests.integration.observe.http_support import get
from worker.bundled import samples_dir
from worker.devkit.local_kafka.config import free_port
from worker.tools.produce import produce_folder
from worker.wire.moderation_codec import decode_result

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(MISSING), reason=f"needs the gen extra ({', '.join(MISSING)} "
                                             "missing): pip install 'kafka-trt-worker[gen]'"),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_one_process_answers_a_moderation_and_a_generation_job(
    kafka_bootstrap: str, engine_cache: Path, tmp_path: Path, guarantee: str  # noqa: F811
) -> None:
    mod = fresh_topics(kafka_bootstrap, partitions=2)
    gen = fresh_topics(kafka_bootstrap, partitions=2)
    cfg = worker_config(kafka_bootstrap, mod, processing={"guarantee": guarantee})
    generation = {
        "random_weights": "tiny", "backend": "torch", "device": "cpu", "warm_up": "first_use",
        "sizes": [{"width": SIDE, "height": SIDE}], "text_batch_sizes": [2],
        "unet_batch_sizes": [2], "vae_batch_sizes": [1], "max_steps": 4,
        "max_images_per_job": 1, "png_threads": 1,
        "blob": {"local_dir": str(tmp_path / "blobs")},
        "topics": {"jobs": gen.jobs, "results": gen.results, "dlq": gen.dlq},
    }
    port = free_port()
    env = worker_env(cfg, KTW_PROCESSING__TASK="moderation,generation",
                     KTW_GENERATION=json.dumps(generation),
                     KTW_ENGINES__CACHE_DIR=str(engine_cache),
                     KTW_BATCH__MAX_DELAY_MS="20", KTW_MODEL__INTRA_OP_THREADS="1",
                     KTW_KAFKA__INSTANCE_ID=f"two-{uuid.uuid4().hex[:6]}",
                     KTW_METRICS__PORT=str(port))
    sent = produce_folder(cfg, samples_dir(), count=2, prefix="mod-")
    produce_records(kafka_bootstrap, gen.jobs, [job("gen-1", steps=2)])
    proc = WorkerProcess(env, tmp_path / "worker.log")
    try:
        mod_results = results_for(kafka_bootstrap, mod.results, {s.id for s in sent})
        gen_results = results_for(kafka_bootstrap, gen.results, {"gen-1"})
        deadline = time.monotonic() + 30
        while (ready := get(f"http://127.0.0.1:{port}/readyz"))[0] != 200 \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready == (200, "ok\n"), ready
        metrics = get(f"http://127.0.0.1:{port}/metrics")[1]
    finally:
        proc.terminate()
        code = proc.wait(90)
    log = proc.log_tail()
    assert code == 0, log
    for s in sent:
        assert decode_result(mod_results[s.id].value())["status"] == "ok", log
    drawn = decode_result(gen_results["gen-1"].value())
    assert drawn["status"] == "ok" and len(drawn["images"]) == 1, log
    for task, topic in (("moderation", mod.jobs), ("generation", gen.jobs)):
        assert f'trt_worker_records_consumed_total{{task="{task}",topic="{topic}"}}' in metrics
    # Each task in its own group: moderation keeps kafka.group_id.
    assert committed(kafka_bootstrap, mod.group, mod.jobs, 2) == end_offsets(
        kafka_bootstrap, mod.jobs, 2)
    assert committed(kafka_bootstrap, f"{mod.group}-generation", gen.jobs, 2) == end_offsets(
        kafka_bootstrap, gen.jobs, 2)
    assert key_counts(read_all(kafka_bootstrap, gen.results, idle_s=0.5)) == {"gen-1": 1}
    assert key_counts(read_all(kafka_bootstrap, mod.results, idle_s=0.5)) == {
        s.id: 1 for s in sent}
    started = [json.loads(line) for line in proc.log_text().splitlines()
               if line.startswith("{") and '"worker_started"' in line]
    assert {(e["task"], e["group"]) for e in started} == {
        ("moderation", mod.group), ("generation", f"{mod.group}-generation")}
    if guarantee == "exactly-once":
        ids = {e["transactional_id"] for e in started}
        assert len(ids) == 2 and all(i is not None for i in ids)


@pytest.mark.timeout(120)
def test_a_failing_loop_stops_the_other_which_commits_and_the_exit_names_it(
    kafka_bootstrap: str, engine_cache: Path, tmp_path: Path  # noqa: F811
) -> None:
    """The generation jobs topic never appears and ``kafka.topics_wait_s`` gives up: the
    generation loop fails, the moderation loop (which answered its jobs meanwhile) drains and
    commits, and the process exits 2 naming generation."""
    mod = fresh_topics(kafka_bootstrap, partitions=2)
    missing = f"gen-jobs-missing-{uuid.uuid4().hex[:8]}"
    cfg = worker_config(kafka_bootstrap, mod)
    generation = {
        "random_weights": "tiny", "backend": "torch", "device": "cpu", "warm_up": "first_use",
        "sizes": [{"width": SIDE, "height": SIDE}],
        "topics": {"jobs": missing, "results": f"{missing}-r", "dlq": f"{missing}-d"},
    }
    env = worker_env(cfg, KTW_PROCESSING__TASK="moderation,generation",
                     KTW_GENERATION=json.dumps(generation),
                     KTW_ENGINES__CACHE_DIR=str(engine_cache),
                     KTW_BATCH__MAX_DELAY_MS="20", KTW_MODEL__INTRA_OP_THREADS="1",
                     KTW_KAFKA__TOPICS_WAIT_S="15")
    sent = produce_folder(cfg, samples_dir(), count=2, prefix="mod-")
    proc = WorkerProcess(env, tmp_path / "worker.log")
    try:
        answered = results_for(kafka_bootstrap, mod.results, {s.id for s in sent})
        code = proc.wait(60)
    finally:
        if proc.proc.poll() is None:
            proc.kill9()
    log = proc.log_text()
    assert code == 2, proc.log_tail()
    assert "error: the generation loop failed:" in log and missing in log, proc.log_tail()
    assert set(answered) == {s.id for s in sent}
    assert committed(kafka_bootstrap, mod.group, mod.jobs, 2) == end_offsets(
        kafka_bootstrap, mod.jobs, 2)
    events = [json.loads(line)["event"] for line in log.splitlines() if line.startswith("{")]
    assert "task_loops_stopping" in events and "worker_draining" in events
