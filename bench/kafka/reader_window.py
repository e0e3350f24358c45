"""What the end-to-end benches' results reader adds to the latency it measures: the reader that
``bench/cpu_e2e.py``, ``bench/frames_e2e.py`` and ``bench/generation/two_tasks.py`` used
(``consume(500, timeout=20 ms)``: librdkafka returns at 500 records or at the timeout, and every
record is stamped when the call returns) against the one they use now (``poll()`` for the first
record, then what is already fetched), on the same records at once.

No worker: one producer sends small records at a fixed rate (``linger.ms`` 0, so a record's
CreateTime is its send time), both readers read the topic, and each record's latency is its
arrival stamp minus its CreateTime. Per rate: p50 / p99 / max per reader, and the raw latencies
as HdrHistogram (microseconds, base64) so runs pool.

    python bench/kafka/reader_window.py [--rates 100,1000,5000] [--seconds 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, provenance, write
from bench.cpu_e2e import READER_POLL_S, Reader, create_topics, local_kafka_class
from bench.frames_e2e import HIST_MAX_US, _histogram, hist_summary

READERS = {"window": True, "prompt": False}


def one_rate(bootstrap: str, rate: float, seconds: float) -> dict[str, Any]:
    import confluent_kafka as ck
    import msgpack

    tag = uuid.uuid4().hex[:8]
    results, dlq = f"rw-results-{tag}", f"rw-dlq-{tag}"
    create_topics(bootstrap, {results: 1, dlq: 1})
    readers = {name: Reader(bootstrap, results, dlq, window=w) for name, w in READERS.items()}
    for r in readers.values():
        r.start()
        if not r.ready.wait(30) or r.error:
            raise RuntimeError(r.error or "reader not ready after 30 s")
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all",
                     "enable.idempotence": True})
    value = msgpack.packb({"v": 1, "status": "ok"})
    # The idempotent producer's id, metadata and connections first (outside the clock: on a
    # fresh broker the first records waited ~0.5 s for the producer id).
    p.produce(dlq, key=b"warm-up", value=value)
    p.flush(30)
    n = int(rate * seconds)
    start = time.perf_counter() + 0.5
    for i in range(n):  # open loop: each record at its scheduled time
        due = start + i / rate
        while (wait := due - time.perf_counter()) > 0:
            time.sleep(min(wait, 0.001))
        p.produce(results, key=f"k{i:08d}".encode(), value=value)
        p.poll(0)
    p.flush(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(len(r.results) < n for r in readers.values()):
        time.sleep(0.05)
    out: dict[str, Any] = {"rate": rate, "records": n}
    for name, r in readers.items():
        r.halt.set()
        r.join(15)
        h = _histogram()
        for arrival, created in r.results.values():
            if created is not None:
                h.record_value(max(1, min(HIST_MAX_US, round((arrival - created) * 1e6))))
        out[name] = {"read": len(r.results), "latency": hist_summary(h),
                     "hdr": h.encode().decode() if h.get_total_count() else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="100,1000,5000", help="records/s, comma separated")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    kafka = local_kafka_class()()
    bootstrap = kafka.start(timeout=180)
    try:
        runs = []
        for rate in (float(x) for x in a.rates.split(",")):
            res = one_rate(bootstrap, rate, a.seconds)
            runs.append(res)
            print(f"{rate:g}/s: " + ", ".join(
                f"{name} p50 {res[name]['latency'].get('p50_ms')} p99 "
                f"{res[name]['latency'].get('p99_ms')} ms" for name in READERS), flush=True)
        record = {"benchmark": "reader_window", "env": environment(),
                  "provenance": {**provenance(), "broker": "local Kafka (KRaft, worker.devkit)",
                                 "broker_version": getattr(kafka, "version", None)},
                  "params": {"rates": a.rates, "seconds": a.seconds,
                             "window_reader": f"consume(500, timeout={READER_POLL_S})",
                             "prompt_reader": f"poll({READER_POLL_S}) then consume(499, 0)",
                             "note": a.note},
                  "runs": runs}
    finally:
        kafka.stop()
    print(f"record {write('reader-window', record, a.out)}")


if __name__ == "__main__":
    main()
