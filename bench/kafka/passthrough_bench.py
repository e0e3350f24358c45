"""Host-path benchmark: the production loop, codec and commit path with an engine that answers
instantly, against a minimal consume -> msgpack decode -> produce loop, on the same broker, with
the same payloads, in the same run.

What runs per payload size (text-only moderation jobs, ``{"v": 1, "id", "text"}`` of about the
given size, produced before the clock starts):

- ``minimal``: one confluent-kafka consumer and producer, no worker code: consume(1000) ->
  msgpack.unpackb -> produce a small msgpack answer keyed by the job id; offsets committed
  asynchronously once a second; ends when every answer is acknowledged.
- ``worker``: :class:`worker.loop.worker.Worker` (intake, batcher, output, at-least-once
  committer: real) serving a task whose "engine" answers at once: the real moderation codec
  decodes each job and encodes its result. Ends when every result is acknowledged. One more,
  untimed run per size is profiled with cProfile; the profile and its top functions are
  written beside the JSON.

Reported: messages/s for each, the ratio, and the worker's host CPU per message (process CPU
time of this process during the run / messages; the broker runs in its own process), and the
loop thread's own CPU time per message (``loop_cpu_us_per_msg``: what the per-record Python work
costs, librdkafka's threads left out).

python bench/kafka/passthrough_bench.py [--jobs 100000] [--sizes 500,1024,16384] [--partitions 6]
                                  [--alt-kafka '{"cloudevents": false}'] [--out DIR]

``--alt-kafka``: per repeat, one more worker run with these kafka settings over the shipped
ones, on a topic of its own filled the same way (e.g. what the CloudEvents headers cost).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import confluent_kafka as ck
import msgpack

from bench.common import RESULTS, environment, median, write
from worker.wire.records import Headers

COMMIT_EVERY_S = 1.0


def payload(i: int, size: int) -> tuple[bytes, bytes]:
    key = f"j-{i:09d}".encode()
    text = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[: max(1, size - 40)]
    return key, msgpack.packb({"v": 1, "id": key.decode(), "text": text})


def fill(bootstrap: str, topic: str, n: int, size: int) -> float:
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                     "compression.type": "lz4", "enable.idempotence": True})
    for i in range(n):
        key, value = payload(i, size)
        while True:
            try:
                p.produce(topic, key=key, value=value)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(120)
    return float(len(payload(0, size)[1]))


def create(bootstrap: str, topics: list[str], partitions: int) -> None:
    from worker.devkit.local_kafka.admin import create_topics

    create_topics(bootstrap, topics, partitions=partitions)


def filled_topics(bootstrap: str, partitions: int, n: int, size: int) -> str:
    """The tag of fresh jobs, results and DLQ topics for a worker run, ``n`` jobs of ``size``
    bytes waiting in the jobs topic."""
    tag = uuid.uuid4().hex[:8]
    create(bootstrap, [f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}"], partitions)
    fill(bootstrap, f"jobs-{tag}", n, size)
    return tag


def minimal(bootstrap: str, jobs: str, results: str, n: int) -> dict[str, float]:
    """The floor: what one Python process does with no worker code at all."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"min-{uuid.uuid4().hex[:8]}",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "fetch.wait.max.ms": 20})
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                     "enable.idempotence": True, "compression.type": "lz4"})
    acked = [0]

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    c.subscribe([jobs])
    seen, started, cpu0, last_commit = 0, None, 0.0, time.monotonic()
    deadline = time.monotonic() + 600
    while acked[0] < n and time.monotonic() < deadline:
        msgs = c.consume(1000, timeout=0.1)
        if msgs and started is None:
            started, cpu0 = time.perf_counter(), time.process_time()
        for m in msgs:
            if m.error() is not None:
                continue
            job = msgpack.unpackb(m.value() or b"")
            value = msgpack.packb({"v": 1, "id": job["id"], "status": "ok"})
            while True:
                try:
                    p.produce(results, key=m.key(), value=value, on_delivery=delivered)
                    break
                except BufferError:
                    p.poll(0.01)
            seen += 1
        p.poll(0)
        if time.monotonic() - last_commit > COMMIT_EVERY_S:
            last_commit = time.monotonic()
            with contextlib.suppress(ck.KafkaException):  # nothing consumed yet
                c.commit(asynchronous=True)
    p.flush(60)
    assert started is not None
    took, cpu = time.perf_counter() - started, time.process_time() - cpu0
    c.close()
    return {"messages": seen, "acked": acked[0], "seconds": took, "msg_s": acked[0] / took,
            "cpu_us_per_msg": cpu / max(acked[0], 1) * 1e6}


@dataclass(slots=True)
class _Item:
    record: Any
    job: Any
    epoch: int
    consumed_at: float
    deadline_ms: int | None = None

    @property
    def partition_key(self) -> tuple[str, int]:
        return (self.record.topic, self.record.partition)

    @property
    def item_shape(self) -> tuple[int, ...]:
        return (1,)


class InstantTask:
    """The Task protocol with the real codec and batcher; the "engine" answers at once."""

    def __init__(self, cfg: Any) -> None:
        from engines.profiles import RangeProfile
        from worker.tasks.batcher import DynamicBatcher
        from worker.tasks.protocol import TaskTopics

        self.cfg = cfg
        self.topics = TaskTopics(cfg.topics.jobs, cfg.topics.results, cfg.topics.dlq)
        self.model_id, self.engine_hash = "instant", "none"
        self.on_batch_done: Callable[[float, int, str, int], None] | None = None
        b = cfg.batch
        self._batcher: Any = DynamicBatcher(
            (RangeProfile("all", (1,), (1,), (1,), 1, b.max_batch_size, b.max_batch_size),),
            max_batch_size=b.max_batch_size, max_delay_s=b.max_delay_ms / 1e3,
            max_pad_fraction=b.max_pad_fraction)
        self._done: list[Future[list[Any]]] = []
        self._headers: Headers = [("ktw.schema", b"moderation-result/v1")]

    def warm_up(self) -> None:
        """No engine to warm."""

    def admit(self, batch: Any) -> list[Any]:
        from worker.tasks.protocol import admit_each
        from worker.wire.moderation_codec import decode_moderation_job

        def one(record: Any, value: bytes, epoch: int) -> None:
            self._batcher.add(_Item(record, decode_moderation_job(value), epoch,
                                    batch.consumed_at))

        return admit_each(batch, self.cfg.limits.max_message_bytes, one)

    def schedule(self, now: float, now_ms: int, *, free: int, force: bool) -> list[Any]:
        due = self._batcher.schedule(now, now_ms, limit=max(free, 1), force=True)
        return [a for b in due.batches for a in self._answers(b, now)]

    def _answers(self, batch: Any, now: float) -> list[Any]:
        from worker.tasks.protocol import Answer, source_ref
        from worker.wire.moderation_codec import encode_result
        from worker.wire.moderation_jobs import ModerationResult, Status, Verdict

        out = []
        for it in batch.items:
            ref = source_ref(it.record)
            r = ModerationResult(id=it.job.id, status=Status.OK, policy=it.job.policy,
                                 model_id="instant", engine_hash="none",
                                 verdict=Verdict.ALLOW, scores={"sfw": 1.0, "nsfw": 0.0},
                                 source=ref)
            out.append(Answer(ref, it.record, it.epoch, r.id, "ok", r.id.encode(),
                              encode_result(r), self._headers, None, it.consumed_at, now,
                              time.monotonic()))
        return out

    def collect(self, *, block: bool) -> list[Any]:
        return []

    def remove(self, keys: set[tuple[str, int]]) -> None:
        self._batcher.remove(lambda it: it.partition_key in keys)

    def held(self) -> int:
        return len(self._batcher)

    def in_flight(self) -> int:
        return 0

    def wait(self, timeout: float) -> None:
        """Nothing is ever in flight: answers come back from schedule()."""

    def ready(self) -> bool:
        return True

    def unavailable(self) -> str | None:
        return None

    def close(self) -> None:
        """No engine or pool to close."""


BENCH_POLL_TIMEOUT_MS = 5.0  # the benchmarks' batch.poll_timeout_ms (50 ships)


def worker_config(bootstrap: str, tag: str, kafka: dict[str, Any] | None = None,
                  batch: dict[str, Any] | None = None) -> Any:
    """The benchmarks' worker config: topics and group named by ``tag``, large fast batches,
    ``kafka`` settings over the shipped ones, ``batch`` over the benchmarks' batch settings."""
    from worker.config import load_config

    return load_config(kafka={"bootstrap_servers": bootstrap, "group_id": f"g-{tag}",
                              **(kafka or {})},
                       topics={"jobs": f"jobs-{tag}", "results": f"results-{tag}",
                               "dlq": f"dlq-{tag}"},
                       batch={"max_batch_size": 512, "max_delay_ms": 2, "high_watermark": 20000,
                              "low_watermark": 5000, "poll_timeout_ms": BENCH_POLL_TIMEOUT_MS,
                              **(batch or {})},
                       log={"level": "WARNING"})


def through_worker(bootstrap: str, tag: str, n: int, profile_to: Path | None,
                   kafka: dict[str, Any] | None = None) -> dict[str, Any]:
    from worker.logs import configure_logging
    from worker.loop.build import build_worker

    configure_logging("WARNING")
    cfg = worker_config(bootstrap, tag, kafka)
    worker = build_worker(cfg, InstantTask(cfg))
    prof = cProfile.Profile() if profile_to is not None else None
    marks: dict[str, float] = {}

    def run() -> None:
        if prof is not None:
            prof.enable()
        try:
            worker.run()
        finally:
            if prof is not None:
                prof.disable()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    deadline = time.monotonic() + 600
    while worker.stats.consumed == 0 and time.monotonic() < deadline:
        time.sleep(0.0005)
    # The loop thread's own CPU clock: less moved by the broker and the VM's neighbours than
    # the wall clock or the process's CPU time (which counts librdkafka's threads too).
    loop_clock = time.pthread_getcpuclockid(th.ident or 0)
    marks["t0"], marks["cpu0"] = time.perf_counter(), time.process_time()
    marks["loop0"] = time.clock_gettime(loop_clock)
    # Done when every result is acknowledged: nothing pending in the committer.
    while time.monotonic() < deadline and not (
            worker.stats.results >= n and worker.committer.pending() == 0):
        time.sleep(0.001)
    took, cpu = time.perf_counter() - marks["t0"], time.process_time() - marks["cpu0"]
    loop_cpu = time.clock_gettime(loop_clock) - marks["loop0"]
    results = worker.stats.results
    worker.stop()
    th.join(120)
    out: dict[str, Any] = {"results": results, "seconds": took, "msg_s": results / took,
                           "cpu_us_per_msg": cpu / max(results, 1) * 1e6,
                           "loop_cpu_us_per_msg": loop_cpu / max(results, 1) * 1e6,
                           "hops": worker.hops.summary()}
    if prof is not None and profile_to is not None:
        prof.dump_stats(str(profile_to.with_suffix(".prof")))
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        profile_to.with_suffix(".txt").write_text(s.getvalue())
        out["profile"] = profile_to.with_suffix(".prof").name
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--sizes", default="500,1024,16384")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--alt-kafka", type=json.loads, default=None,
                    help="kafka settings of one more worker run per repeat")
    args = ap.parse_args()
    from worker.devkit.local_kafka import kafka_from_env_or_local

    record: dict[str, Any] = {"benchmark": "passthrough", "env": environment(),
                              "params": {"jobs": args.jobs, "sizes": args.sizes,
                                         "partitions": args.partitions,
                                         "repeats": args.repeats,
                                         "alt_kafka": args.alt_kafka}, "runs": []}
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    outdir = args.out or RESULTS
    outdir.mkdir(parents=True, exist_ok=True)
    with kafka_from_env_or_local() as bootstrap:
        from worker.devkit.local_kafka import DEFAULT_VERSION

        record["broker"] = {"kind": "Apache Kafka", "version": DEFAULT_VERSION,
                            "bootstrap": bootstrap}
        for size in (int(s) for s in args.sizes.split(",")):
            mins, works, alts = [], [], []
            for r in range(args.repeats):
                tag = uuid.uuid4().hex[:8]
                create(bootstrap, [f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}",
                                  f"results-{tag}-min"],
                       args.partitions)
                value_bytes = fill(bootstrap, f"jobs-{tag}", args.jobs, size)
                mins.append(minimal(bootstrap, f"jobs-{tag}", f"results-{tag}-min",
                                    args.jobs))
                works.append(through_worker(bootstrap, tag, args.jobs, None))
                print(f"{size} B #{r}: minimal {mins[-1]['msg_s']:,.0f} msg/s, worker "
                      f"{works[-1]['msg_s']:,.0f} msg/s "
                      f"({works[-1]['cpu_us_per_msg']:.1f} us CPU/msg, loop thread "
                      f"{works[-1]['loop_cpu_us_per_msg']:.1f})", flush=True)
                if args.alt_kafka is not None:
                    alt = filled_topics(bootstrap, args.partitions, args.jobs, size)
                    alts.append(through_worker(bootstrap, alt, args.jobs, None,
                                               kafka=args.alt_kafka))
                    print(f"{size} B #{r}: worker with {args.alt_kafka} "
                          f"{alts[-1]['msg_s']:,.0f} msg/s "
                          f"({alts[-1]['cpu_us_per_msg']:.1f} us CPU/msg)", flush=True)
            # A separate profiled run (cProfile slows every Python call, so it is never timed).
            tag = filled_topics(bootstrap, args.partitions, args.jobs, size)
            profiled = through_worker(bootstrap, tag, args.jobs,
                                      outdir / f"passthrough-{stamp}-{size}B")
            m = median([x["msg_s"] for x in mins])
            w = median([x["msg_s"] for x in works])
            record["runs"].append({"value_bytes": value_bytes, "minimal": mins, "worker": works,
                                   "minimal_msg_s": m, "worker_msg_s": w, "ratio": w / m,
                                   "profiled_run": profiled,
                                   **({"worker_alt": alts,
                                       "worker_alt_msg_s": median([x["msg_s"] for x in alts]),
                                       "worker_alt_cpu_us_per_msg": median(
                                           [x["cpu_us_per_msg"] for x in alts])}
                                      if alts else {})})
    print(f"{'value B':>8} {'minimal msg/s':>14} {'worker msg/s':>13} {'ratio':>6} "
          f"{'us CPU/msg':>11}")
    for r in record["runs"]:
        cpu = median([x["cpu_us_per_msg"] for x in r["worker"]])
        print(f"{r['value_bytes']:>8.0f} {r['minimal_msg_s']:>14,.0f} "
              f"{r['worker_msg_s']:>13,.0f} {r['ratio']:>6.2f} {cpu:>11.1f}")
    print("wrote", write("passthrough", record, args.out))


if __name__ == "__main__":
    main()
