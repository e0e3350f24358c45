"""The replay runs the worker loop (worker.loop.worker.Worker) over its own parts
(worker/tools/replay/parts.py), stepped here against in-memory stand-ins for librdkafka's
consumer and producer and for the task: exactly the range, the source headers, counted or
dead-lettered rejections, --max-records, a delivery failure, and no commit ever. The real
broker and model: tests/integration/tools/test_replay.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest

from worker.config import WorkerConfig, load_config
from worker.exceptions import DeliveryFailed, SchemaViolation
from worker.tasks.protocol import Answer, ConsumedBatch, TaskTopics, source_ref
from worker.tools.replay.headers import parse_written
from worker.tools.replay.ranges import parse_bound
from worker.tools.replay.runner import ReplayRunner, ReplaySummary
from worker.tools.replay.start import ReplayRequest
from worker.wire.records import SourceRecord

JOBS, OUT, DLQ = "jobs", "replay-out", "replay-dlq"
LOG_END = 6  # records 0..5 in each of the two partitions


class Msg:
    """What librdkafka hands out for a record (the calls the loop and the reader make)."""

    def __init__(self, topic: str, partition: int, offset: int, value: bytes | None,
                 key: bytes | None = None, headers: list[Any] | None = None) -> None:
        self._t, self._p, self._o, self._v, self._k, self._h = (topic, partition, offset, value,
                                                                key, headers)

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> list[Any] | None:
        return self._h

    def timestamp(self) -> tuple[int, int]:
        return ck.TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + self._o

    def __len__(self) -> int:
        return len(self._v or b"")


class Log:
    """The jobs topic and what was produced, shared by the stand-in clients."""

    def __init__(self, values: dict[tuple[int, int], bytes]) -> None:
        self.values = values
        self.produced: list[tuple[str, bytes | None, bytes | None, list[Any]]] = []
        self.fail_delivery = False
        self.commits = 0


class FakeConsumerClient:
    """ck.Consumer over :class:`Log`: assign, consume, poll, position, pause; it never
    joins a group, and a commit is counted (the replay must never make one)."""

    log: Log

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.at: dict[int, int] = {}
        self.paused: set[int] = set()

    def assign(self, tps: list[ck.TopicPartition]) -> None:
        self.at = {tp.partition: tp.offset for tp in tps}

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Msg]:
        out: list[Msg] = []
        for p in sorted(self.at):
            while (p not in self.paused and len(out) < num_messages
                   and (p, self.at[p]) in self.log.values):
                off = self.at[p]
                out.append(Msg(JOBS, p, off, self.log.values[(p, off)], f"k{p}-{off}".encode()))
                self.at[p] = off + 1
        return out

    def poll(self, timeout: float = -1) -> Msg | None:
        got = self.consume(1)
        return got[0] if got else None

    def position(self, tps: list[ck.TopicPartition]) -> list[ck.TopicPartition]:
        return [ck.TopicPartition(tp.topic, tp.partition, self.at.get(tp.partition, -1001))
                for tp in tps]

    def pause(self, tps: list[ck.TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[ck.TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self.log.commits += 1

    def close(self) -> None:
        """The stand-in holds no connection."""


class FakeProducerClient:
    """ck.Producer over :class:`Log`: every record lands on partition 0 of its topic."""

    log: Log

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self._waiting: list[tuple[Msg, Any]] = []
        self._next: dict[str, int] = {}

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                headers: list[Any] | None = None, on_delivery: Any = None) -> None:
        off = self._next.get(topic, 0)
        self._next[topic] = off + 1
        self._waiting.append((Msg(topic, 0, off, value, key, headers), on_delivery))

    def poll(self, timeout: float = 0) -> int:
        waiting, self._waiting = self._waiting, []
        for msg, report in waiting:
            if self.log.fail_delivery:
                report(ck.KafkaError(ck.KafkaError.MSG_SIZE_TOO_LARGE), msg)
                continue
            self.log.produced.append((msg.topic(), msg.key(), msg.value(), msg.headers()))
            report(None, msg)
        return len(waiting)

    def flush(self, timeout: float = -1) -> int:
        self.poll()
        return 0


class FakeTask:
    """Answers each admitted job in the next batch; a ``bad`` value is rejected at admit."""

    topics = TaskTopics(JOBS, "live-results", "live-dlq")
    model_id, engine_hash = "open_nsfw", "engine-1"
    on_batch_done = None

    def __init__(self, warm_up_s: float = 0.0) -> None:
        self.queued: list[tuple[SourceRecord, int]] = []
        self.closed = 0
        self.warm_up_s = warm_up_s
        self.admitted_at: list[float] = []

    def warm_up(self) -> None:
        time.sleep(self.warm_up_s)

    def admit(self, batch: ConsumedBatch) -> list[Answer]:
        self.admitted_at += [time.monotonic()] * len(batch.records)
        rejected = []
        for r in batch.records:
            if r.value == b"bad":
                rejected.append(Answer(source_ref(r), r, batch.epoch(r),
                                       rejection=SchemaViolation("not a job")))
            else:
                self.queued.append((r, batch.epoch(r)))
        return rejected

    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Answer]:
        return []

    def collect(self, *, block: bool) -> list[Answer]:
        done, self.queued = self.queued, []
        return [Answer(source_ref(r), r, epoch, f"j{r.offset}", "ok", r.key,
                       b"result:" + (r.value or b""), [("ktw.engine", b"engine-1")])
                for r, epoch in done]

    def remove(self, keys: Any) -> None:
        """Never called: a replay has no revocations."""

    def held(self) -> int:
        return len(self.queued)

    def in_flight(self) -> int:
        return 0

    def wait(self, timeout: float) -> None:
        """Batches finish on their own thread; the loop's wait is not needed here."""

    def ready(self) -> bool:
        return True

    def unavailable(self) -> str | None:
        return None

    def close(self) -> None:
        self.closed += 1


class FakeAdmin:
    """The look-ups the request's validation makes: two partitions of LOG_END records."""

    def partitions(self, topic: str) -> list[int]:
        return [0, 1]

    def watermarks(self, topic: str, partitions: Any, *, committed_only: bool = False
                   ) -> dict[int, tuple[int, int]]:
        return {p: (0, LOG_END if topic == JOBS else 0) for p in partitions}


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> Log:
    values = {(p, o): b"bad" if (p, o) == (1, 2) else f"img-{p}-{o}".encode()
              for p in (0, 1) for o in range(LOG_END)}
    shared = Log(values)
    FakeConsumerClient.log = FakeProducerClient.log = shared
    monkeypatch.setattr(ck, "Consumer", FakeConsumerClient)
    monkeypatch.setattr(ck, "Producer", FakeProducerClient)
    return shared


def _cfg() -> WorkerConfig:
    return load_config(None, kafka={"bootstrap_servers": "127.0.0.1:9"},
                       batch={"max_batch_size": 4, "poll_timeout_ms": 5})


def _replay(tmp_path: Path, task: FakeTask | None = None, *, start: str = "earliest",
            end: str = "latest", **kw: Any) -> tuple[ReplaySummary, FakeTask]:
    task = task or FakeTask()
    req = ReplayRequest(topic=JOBS, to_topic=OUT, start=parse_bound(start),
                        end=parse_bound(end), state_file=tmp_path / "state.json", **kw)
    runner = ReplayRunner(_cfg(), req, task=task, admin=FakeAdmin())  # type: ignore[arg-type]
    return runner.run(), task


def _written(log: Log, topic: str) -> list[tuple[int, int]]:
    out = []
    for t, _key, _value, headers in log.produced:
        w = parse_written(headers) if t == topic else None
        if w is not None:
            out.append((w.partition, w.offset))
    return sorted(out)


def test_the_loop_answers_exactly_the_range_into_the_replay_topic(tmp_path: Path,
                                                                   log: Log) -> None:
    summary, task = _replay(tmp_path, start="2", end="offset:5")
    want = [(p, o) for p in (0, 1) for o in range(2, 5) if (p, o) != (1, 2)]
    assert _written(log, OUT) == want
    assert summary.finished and summary.ranges == {0: (2, 5), 1: (2, 5)}
    assert summary.counts == {"result:ok": 5, "rejected:schema": 1}
    assert summary.handled_this_run == 6
    topics = {t for t, *_ in log.produced}
    assert topics == {OUT}, "the live topics get nothing, the rejection is only counted"
    _t, key, value, headers = log.produced[0]
    assert key == b"k0-2" and value == b"result:img-0-2"
    h = dict(headers)
    assert h["ktw.engine"] == b"engine-1" and h["ktw.source.topic"] == JOBS.encode()
    assert h["ktw.replay.id"] == summary.replay_id.encode()
    assert log.commits == 0, "a replay never commits"
    assert task.closed == 1
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["finished"] is True and state["engine"] == "engine-1"


def test_rejections_go_to_the_dlq_topic_only_when_given(tmp_path: Path, log: Log) -> None:
    summary, _ = _replay(tmp_path, dlq_topic=DLQ)
    assert summary.counts == {"result:ok": 11, "dlq:schema": 1}
    assert _written(log, DLQ) == [(1, 2)]
    dead = [h for t, _k, _v, h in log.produced if t == DLQ]
    assert dict(dead[0])["ktw.replay.id"] == summary.replay_id.encode()


def test_max_records_stops_the_loop_and_the_same_request_resumes(tmp_path: Path,
                                                                 log: Log) -> None:
    first, _ = _replay(tmp_path, max_records=5)
    assert not first.finished and first.handled_this_run == 5
    assert len(log.produced) == 5
    second, _ = _replay(tmp_path)
    assert second.resumed and second.finished and second.handled_this_run == 7
    assert second.counts == {"result:ok": 11, "rejected:schema": 1}
    assert _written(log, OUT) == [(p, o) for p in (0, 1) for o in range(LOG_END)
                                  if (p, o) != (1, 2)], "each record once"


def test_a_refused_delivery_stops_the_replay_without_counting_it(tmp_path: Path,
                                                                log: Log) -> None:
    log.fail_delivery = True
    with pytest.raises(DeliveryFailed, match="delivery of the answer"):
        _replay(tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["finished"] is False
    counts = [c for part in state["partitions"].values() for c in part["counts"]]
    done = [k for part in state["partitions"].values() for k in part["done"].values()]
    assert not [k for k in counts + done if k.startswith("result:")], "nothing delivered"


def test_the_rate_counts_from_the_first_read_not_from_the_warm_up(tmp_path: Path,
                                                                 log: Log) -> None:
    # 12 records at 20/s: one token at the start, then one every 50 ms, so the last is taken
    # 0.55 s after the first; tokens saved up while the task warmed up would be a burst.
    summary, task = _replay(tmp_path, FakeTask(warm_up_s=0.6), rate=20.0)
    assert summary.finished and len(task.admitted_at) == 12
    span = task.admitted_at[-1] - task.admitted_at[0]
    assert 0.45 <= span < 2.0, span
