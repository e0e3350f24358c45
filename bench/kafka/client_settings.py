"""What the worker's Kafka client settings cost: latency at a steady rate and throughput from a
backlog, per setting, on the local Apache Kafka, with the production loop and an engine that
answers at once (``bench.kafka.passthrough_bench.InstantTask``), so only the client path is
measured.

Per variant (one setting changed from the shipped defaults):

- ``latency``: a producer (linger 5 ms, as a camera gateway would batch) sends ``--rate`` jobs/s
  of ~1 KB for ``--seconds``; a reader (``assign()``, fetch.wait.max.ms 5) takes the results;
  latency = the reader's arrival time - the job's send time, p50 / p99, first second dropped.
- ``backlog``: ``--jobs`` jobs wait on a fresh topic; the worker's messages/s until every result
  is acknowledged (as in bench/kafka/passthrough_bench.py).

Settings: ``kafka.fetch_wait_max_ms`` (5 / 20 shipped / 100), the results producer's
``linger.ms`` (0 / 5 shipped / 20, through ``kafka.producer_extra``) and ``kafka.compression``
(none shipped / lz4 / zstd). The worker, the producer and the reader run in this one process (one
GIL) and share the machine's cores with the broker; read the ratios, not the absolute figures.
A warm-up run comes first and the shipped defaults run again last, to show the drift.

python bench/kafka/client_settings.py [--rate 2000] [--seconds 8] [--jobs 40000] [--only TEXT]
                                [--no-backlog] [--poll-timeout-ms MS] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import confluent_kafka as ck
import msgpack

from bench.common import environment, write
from bench.kafka.passthrough_bench import (
    BENCH_POLL_TIMEOUT_MS,
    InstantTask,
    create,
    fill,
    through_worker,
    worker_config,
)

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("shipped defaults", {}),
    ("fetch_wait_max_ms 5", {"fetch_wait_max_ms": 5}),
    ("fetch_wait_max_ms 100", {"fetch_wait_max_ms": 100}),
    ("producer linger.ms 0", {"producer_extra": {"linger.ms": "0"}}),
    ("producer linger.ms 20", {"producer_extra": {"linger.ms": "20"}}),
    ("compression lz4", {"compression": "lz4"}),
    ("compression zstd", {"compression": "zstd"}),
]


def latency(bootstrap: str, kafka: dict[str, Any], rate: int, seconds: float,
            batch: dict[str, Any] | None = None) -> dict[str, Any]:
    from worker.logs import configure_logging
    from worker.loop.build import build_worker

    configure_logging("WARNING")
    tag = uuid.uuid4().hex[:8]
    create(bootstrap, [f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}"], 6)
    cfg = worker_config(bootstrap, tag, kafka, batch)
    worker = build_worker(cfg, InstantTask(cfg))
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    reader = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{tag}",
                          "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    meta = reader.list_topics(f"results-{tag}", timeout=30).topics[f"results-{tag}"]
    reader.assign([ck.TopicPartition(f"results-{tag}", p, ck.OFFSET_BEGINNING)
                   for p in meta.partitions])
    deadline = time.monotonic() + 60
    while not worker.vitals.subscribed or not worker.assignment.owned:
        if time.monotonic() > deadline:
            raise RuntimeError("the worker was not assigned its partitions within 60 s")
        time.sleep(0.05)
    sent: dict[bytes, float] = {}
    lat: list[tuple[float, float]] = []  # (send time, latency)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set() or len(lat) < len(sent):
            # A short timeout: consume(n, t) returns only at n records or t, which adds to the
            # latency it measures.
            for m in reader.consume(1000, timeout=0.002):
                key = m.key()
                if m.error() is None and key is not None and key in sent:
                    now = time.perf_counter()
                    lat.append((sent[key], now - sent[key]))
            if stop.is_set() and time.perf_counter() - last[0] > 10:
                return

    last = [time.perf_counter()]
    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    text = "lorem ipsum dolor sit amet " * 36
    start, n = time.perf_counter(), int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        while (now := time.perf_counter()) < due:
            time.sleep(min(0.001, due - now))
        key = f"j-{tag}-{i:08d}".encode()
        sent[key] = time.perf_counter()
        producer.produce(f"jobs-{tag}", key=key,
                         value=msgpack.packb({"v": 1, "id": key.decode(), "text": text}))
        producer.poll(0)
    producer.flush(30)
    last[0] = time.perf_counter()
    stop.set()
    reading.join(40)
    worker.stop()
    runner.join(60)
    reader.close()
    steady = sorted(x for t, x in lat if t - start >= 1.0)  # the first second warms up
    if not steady:
        raise RuntimeError("no results read")
    def ms(f: float) -> float:
        return steady[min(len(steady) - 1, int(len(steady) * f))] * 1e3

    return {"rate": rate, "seconds": seconds, "sent": n, "answered": len(lat),
            "p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": steady[-1] * 1e3}


def backlog(bootstrap: str, kafka: dict[str, Any], jobs: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    create(bootstrap, [f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}"], 6)
    fill(bootstrap, f"jobs-{tag}", jobs, 1024)
    out = through_worker(bootstrap, tag, jobs, None, kafka=kafka)
    return {"jobs": jobs, "msg_s": out["msg_s"], "cpu_us_per_msg": out["cpu_us_per_msg"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--jobs", type=int, default=40_000)
    ap.add_argument("--only", default="", help="run the variants whose label contains this")
    ap.add_argument("--no-backlog", action="store_true", help="latency only")
    ap.add_argument("--poll-timeout-ms", type=float, default=None,
                    help="the worker's batch.poll_timeout_ms in the latency runs (the benches "
                         "use 5; 50 ships): how long an idle worker's consume may block")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from worker.devkit.local_kafka import DEFAULT_VERSION, kafka_from_env_or_local

    record: dict[str, Any] = {"benchmark": "client-settings", "env": environment(),
                              "params": {"rate": args.rate, "seconds": args.seconds,
                                         "jobs": None if args.no_backlog else args.jobs,
                                         "only": args.only, "job_bytes": 1024,
                                         "poll_timeout_ms":
                                             args.poll_timeout_ms or BENCH_POLL_TIMEOUT_MS},
                              "variants": []}
    with kafka_from_env_or_local() as bootstrap:
        record["broker"] = {"kind": "Apache Kafka", "version": DEFAULT_VERSION}
        # The first run on a fresh broker pays its warm-up (topic creation, JIT): not compared.
        batch = {} if args.poll_timeout_ms is None else {"poll_timeout_ms": args.poll_timeout_ms}
        record["warm_up"] = latency(bootstrap, {}, args.rate, min(args.seconds, 4.0), batch)
        for label, kafka in [*VARIANTS, ("shipped defaults, again", {})]:
            if args.only not in label and label != "shipped defaults":
                continue
            lat = latency(bootstrap, kafka, args.rate, args.seconds, batch)
            thr = {"msg_s": float("nan")} if args.no_backlog else backlog(bootstrap, kafka,
                                                                           args.jobs)
            record["variants"].append({"label": label, "kafka": kafka, "latency": lat,
                                       "backlog": thr})
            print(f"{label:24s} p50 {lat['p50_ms']:6.1f} ms  p99 {lat['p99_ms']:6.1f} ms  "
                  f"({lat['answered']}/{lat['sent']})  backlog {thr['msg_s']:8,.0f} msg/s",
                  flush=True)
    print("wrote", write("client-settings", record, args.out))


if __name__ == "__main__":
    main()
