"""nvImageCodec against torchvision's CUDA JPEG decoder, from 1 to 8 threads (GPU machine).

torchvision keeps one nvJPEG decoder per process behind a mutex, so four threads each decoding
batches of 128 wait on each other (6.7 ms per call alone, ~28 ms with four; bench/NOTES.md).
:mod:`bench.nvimgcodec_ops` gives each thread its own nvImageCodec
decoder. On the bench's real photos (bench/corpus.py, 256x256 q90, ~16 KB) this measures:

- images/s (median of rounds, each round ends with every thread's stream synchronised) and the
  median host time per call, for torchvision (``jpeg_ops.decode_jpegs``) and nvImageCodec, in
  batches of 128 from 1/2/4/8 threads, one torch CUDA stream each; nvImageCodec also in
  batches of 512, and with its CUDA decoder only (no NVJPG hardware engine);
- which backends decode the corpus (hardware engine alone, CUDA decoder alone);
- parity on the first batch: nvImageCodec GPU vs torchvision CUDA vs torchvision CPU (and
  nvImageCodec's own CPU backend), max / mean absolute difference; results read on the
  decode stream with no synchronisation in between (stream order);
- accept/reject of bad files (garbage, empty, truncated) by each decoder and by Pillow.

Every failure is caught, printed with its reason and written to the JSON, which is rewritten
after each step (a crash still leaves the steps before it).

    pip install --no-index --no-deps --target /tmp/site .nvimg/*.whl
    PYTHONPATH=/tmp/site:$PWD python3 bench/nvimgcodec_probe.py --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "1")  # the library's errors, on stderr

from bench.common import RESULTS, environment, median

T0 = time.perf_counter()


class Probe:
    """The JSON record, rewritten after each step; steps catch and record their failures."""

    def __init__(self, out_dir: Path, params: dict[str, Any]) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.path = out_dir / f"nvimgcodec-probe-{stamp}.json"
        self.record: dict[str, Any] = {"benchmark": "nvimgcodec_probe", "params": params,
                                       "errors": {}, "step_s": {}}

    def save(self) -> None:
        self.record["elapsed_s"] = round(time.perf_counter() - T0, 1)
        self.path.write_text(json.dumps(self.record, indent=2, sort_keys=True, default=str))

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        print(f"[{time.perf_counter() - T0:6.1f}s] {name}", flush=True)
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - recorded; the next steps still run
            reason = f"{type(exc).__name__}: {exc}"
            self.record["errors"][name] = {"reason": reason,
                                           "traceback": traceback.format_exc()[-3000:]}
            print(f"  FAILED {name}: {reason}", flush=True)
        finally:
            self.record["step_s"][name] = round(time.perf_counter() - t, 2)
            self.save()


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"bench_commit_env": os.environ.get("BENCH_COMMIT")}
    for dist in ("torch", "torchvision", "nvidia-nvimgcodec-cu13", "nvidia-nvjpeg", "numpy",
                 "pillow"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out  # the GPU and its driver: bench.common.environment(), beside this


def loaded_libraries() -> list[str]:
    """The nvJPEG / nvImageCodec / CUDA runtime files mapped into this process."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    keys = ("nvjpeg", "nvimgcodec", "cudart")
    return sorted({ln.split()[-1] for ln in maps if any(k in ln.rsplit("/", 1)[-1] for k in keys)})


def diff_stats(a: list[Any], b: list[Any]) -> dict[str, Any]:
    """Max / mean absolute difference over the images both sides decoded (as uint8 CHW)."""
    worst, total, n, mism, missing = 0, 0.0, 0, 0, 0
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            missing += 1
            continue
        if tuple(x.shape) != tuple(y.shape):
            mism += 1
            continue
        d = (x.to("cpu", non_blocking=False).int() - y.to("cpu").int()).abs()
        worst, total, n = max(worst, int(d.max())), total + float(d.float().sum()), n + d.numel()
    return {"max_abs": worst, "mean_abs": round(total / max(n, 1), 4), "images": len(a),
            "shape_mismatch": mism, "missing": missing}


def measure(decode: Callable[[Any], list[Any]], batches: list[Any], threads: int,
            rounds: int, calls: int) -> dict[str, Any]:
    """``threads`` threads, one CUDA stream each, each making ``calls`` decode calls per round.
    Rounds start and end on a barrier; a thread synchronises its stream before the end."""
    import torch

    barrier = threading.Barrier(threads + 1)
    lock = threading.Lock()
    lat: list[float] = []
    nones: list[int] = []
    errors: list[str] = []

    def work(k: int) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                decode(batches[k % len(batches)])  # warm: this thread's decoder, buffers
                stream.synchronize()
                barrier.wait()
                for _ in range(rounds):
                    barrier.wait()
                    mine, bad = [], 0
                    for i in range(calls):
                        t = time.perf_counter()
                        out = decode(batches[(k * calls + i) % len(batches)])
                        mine.append(time.perf_counter() - t)
                        bad += sum(o is None for o in out)
                    stream.synchronize()
                    with lock:
                        lat.extend(mine)
                        nones.append(bad)
                    barrier.wait()
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors.append(f"thread {k}: {type(exc).__name__}: {exc}")
            barrier.abort()

    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    workers = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    t_warm = time.perf_counter()
    for w in workers:
        w.start()
    rates: list[float] = []
    res: dict[str, Any] = {"threads": threads, "calls_per_thread_per_round": calls}
    try:
        barrier.wait(timeout=60)
        res["warm_s"] = round(time.perf_counter() - t_warm, 3)
        res["device_mem_mb_after_warm"] = round((free0 - torch.cuda.mem_get_info()[0]) / 2**20)
        per_round = threads * calls * len(batches[0])
        for _ in range(rounds):
            barrier.wait(timeout=30)
            t = time.perf_counter()
            barrier.wait(timeout=30)
            rates.append(per_round / (time.perf_counter() - t))
    except threading.BrokenBarrierError:
        if not errors:
            errors.append("barrier broken: a thread stalled for more than 30 s")
    for w in workers:
        w.join(timeout=10)
    if errors:
        res["error"] = errors[0]
    if rates:
        lat.sort()
        res |= {"img_s": round(median(rates)), "img_s_rounds": [round(r) for r in rates],
                "call_ms_p50": round(lat[len(lat) // 2] * 1e3, 2),
                "call_ms_p90": round(lat[int(len(lat) * 0.9)] * 1e3, 2),
                "none_results": sum(nones)}
    return res


def bad_files(photo: bytes) -> dict[str, bytes]:
    n = len(photo)
    return {"garbage": b"\xff\xd8\xff\xe0 not a jpeg", "empty": b"",
            **{f"truncated_{p}pct": photo[: n * p // 100] for p in (25, 50, 90, 99)}}


def verdicts(files: dict[str, bytes], decode: Callable[[bytes], Any]) -> dict[str, str]:
    out = {}
    for name, data in files.items():
        try:
            out[name] = "rejected (None)" if decode(data) is None else "decoded"
        except Exception as exc:  # noqa: BLE001 - a rejection, as the decoder reports it
            out[name] = f"rejected ({type(exc).__name__})"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--images", type=int, default=2048, help="corpus size (distinct photos)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--big-batch", type=int, default=512)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=8, help="calls of --batch per thread per round")
    ap.add_argument("--cpu-threads", type=int, default=None,
                    help="nvImageCodec CPU threads per decoder (default: the module's)")
    ap.add_argument("--budget", type=float, default=100.0,
                    help="seconds; throughput runs not started by then are skipped")
    args = ap.parse_args()
    threads = [int(x) for x in args.threads.split(",")]
    probe = Probe(args.out, {k: str(v) if isinstance(v, Path) else v
                             for k, v in vars(args).items()})
    rec = probe.record
    ctx: dict[str, Any] = {}

    with probe.step("env"):
        rec["versions"] = versions()
        rec["env"] = environment()
    with probe.step("corpus"):
        from bench.corpus import jpeg_photos

        photos = jpeg_photos(args.images)
        ctx["photos"] = photos
        rec["corpus"] = {"images": len(photos), "mean_bytes": round(sum(map(len, photos))
                                                                     / len(photos))}
    with probe.step("import"):
        import torch

        ctx["cuda"] = torch.cuda.is_available()
        rec["cuda_available"] = ctx["cuda"]
        if ctx["cuda"]:
            rec["device"] = torch.cuda.get_device_name(0)
    with probe.step("nvimgcodec"):
        t = time.perf_counter()
        from bench import nvimgcodec_ops

        nv = nvimgcodec_ops._nvimgcodec()
        if args.cpu_threads is not None:
            nvimgcodec_ops.CPU_THREADS = args.cpu_threads
        rec["nvimgcodec"] = {"version": nv.__version__, "cuda_version": nv.__cuda_version__,
                             "import_s": round(time.perf_counter() - t, 2),
                             "cpu_threads": nvimgcodec_ops.CPU_THREADS,
                             "gpu_backends": list(nvimgcodec_ops.GPU_BACKENDS)}
        t = time.perf_counter()
        ok = nvimgcodec_ops.available()
        rec["nvimgcodec"] |= {"available": ok, "reason": nvimgcodec_ops.unavailable_reason(),
                              "available_s": round(time.perf_counter() - t, 2)}
        ctx["nv_ok"] = ok
        print(f"  nvimgcodec {nv.__version__} available={ok} "
              f"{nvimgcodec_ops.unavailable_reason()}", flush=True)
    rec["loaded_libraries"] = loaded_libraries()
    photos = ctx.get("photos") or []
    if "photos" not in ctx or "cuda" not in ctx:
        print("no corpus or no torch: nothing more to run", flush=True)
        probe.save()
        return
    from worker.tasks.moderation.images import jpeg_ops

    first = photos[: args.batch]
    tensors = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in photos]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    outs: dict[str, list[Any]] = {}
    with probe.step("decode_torchvision_cpu"):
        outs["torchvision_cpu"] = jpeg_ops.decode_jpegs(tensors[: args.batch], cpu)
    if "nv_ok" in ctx:
        with probe.step("decode_nvimgcodec_cpu"):
            outs["nvimgcodec_cpu"] = nvimgcodec_ops.decode_jpegs(first, cpu)
    if ctx["cuda"]:
        with probe.step("decode_torchvision_cuda"):
            outs["torchvision_cuda"] = jpeg_ops.decode_jpegs(tensors[: args.batch], cuda)
            torch.cuda.synchronize()
    if ctx.get("nv_ok") and ctx["cuda"]:
        with probe.step("decode_nvimgcodec_cuda"):
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                torch.cuda._sleep(50_000_000)  # a busy stream: a missing wait would show
                got = nvimgcodec_ops.decode_jpegs(first, cuda)
                # Summed on the decode stream with no synchronisation in between; compared
                # below with the same sums after a full synchronisation.
                sums = [None if g is None else g.int().sum() for g in got]
            outs["nvimgcodec_cuda"] = got
            early = [None if x is None else int(x) for x in sums]
            torch.cuda.synchronize()
            late = [None if g is None else int(g.int().sum()) for g in got]
            rec["stream_order_ok"] = early == late
            rec["nvimgcodec_cuda_first_batch_none"] = sum(g is None for g in got)
        with probe.step("backends"):
            # Which backend decodes these files: the NVJPG engines alone, the CUDA decoder alone.
            dev = torch.cuda.current_device()
            params = nvimgcodec_ops._decoder(dev)[1]
            res = {}
            for kinds in (("HW_GPU_ONLY",), ("HYBRID_CPU_GPU",)):
                dec = nv.Decoder(device_id=dev, max_num_cpu_threads=nvimgcodec_ops.CPU_THREADS,
                                 backends=[nv.Backend(getattr(nv.BackendKind, k)) for k in kinds])
                stream = torch.cuda.current_stream().cuda_stream
                dec.decode(first, params=params, cuda_stream=stream)  # warm
                torch.cuda.synchronize()
                t = time.perf_counter()
                got = dec.decode(first, params=params, cuda_stream=stream)
                torch.cuda.synchronize()
                res["+".join(kinds)] = {"decoded": sum(g is not None for g in got),
                                        "of": len(first),
                                        "one_call_synced_ms": round((time.perf_counter() - t)
                                                                    * 1e3, 2)}
                del dec
            rec["backends"] = res
    with probe.step("parity"):
        pairs = [("nvimgcodec_cuda", "torchvision_cpu"), ("nvimgcodec_cuda", "torchvision_cuda"),
                 ("torchvision_cuda", "torchvision_cpu"), ("nvimgcodec_cpu", "torchvision_cpu")]
        rec["parity_first_batch"] = {f"{a}_vs_{b}": diff_stats(outs[a], outs[b])
                                     for a, b in pairs if a in outs and b in outs}
        for k, v in rec["parity_first_batch"].items():
            print(f"  {k}: {v}", flush=True)
    with probe.step("bad_files"):
        from worker.tasks.moderation.images.cpu import decode_image

        files = bad_files(photos[0])
        table: dict[str, dict[str, str]] = {
            "pillow (worker CPU path)": verdicts(files, decode_image),
            "torchvision_cpu": verdicts(files, lambda d: jpeg_ops.decode_jpegs(
                [torch.frombuffer(bytearray(d), dtype=torch.uint8)], cpu)[0])}
        if "nv_ok" in ctx:
            table["nvimgcodec_cpu"] = verdicts(
                files, lambda d: nvimgcodec_ops.decode_jpegs([d], cpu)[0])
        if ctx["cuda"]:
            table["torchvision_cuda"] = verdicts(files, lambda d: jpeg_ops.decode_jpegs(
                [torch.frombuffer(bytearray(d), dtype=torch.uint8)], cuda)[0])
        if ctx.get("nv_ok") and ctx["cuda"]:
            table["nvimgcodec_cuda"] = verdicts(
                files, lambda d: nvimgcodec_ops.decode_jpegs([d], cuda)[0])
            mixed = nvimgcodec_ops.decode_jpegs([photos[0], *files.values(), photos[1]], cuda)
            rec["bad_files_in_one_batch_none"] = [m is None for m in mixed]
        rec["bad_files"] = table
        for k, v in table.items():
            print(f"  {k}: {v}", flush=True)

    if not ctx["cuda"]:
        print("no CUDA device: no throughput runs", flush=True)
        probe.save()
        print("wrote", probe.path)
        return
    runs: list[dict[str, Any]] = rec.setdefault("throughput", [])

    def batches_of(size: int, raw: bool) -> list[Any]:
        src: list[Any] = photos if raw else tensors
        return [src[i:i + size] for i in range(0, len(src) - size + 1, size)]

    # The comparison first, in case the time budget runs out: nvImageCodec and torchvision at
    # --batch, then nvImageCodec at --big-batch and with its CUDA decoder only.
    nv_ok = bool(ctx.get("nv_ok"))
    plan: list[tuple[str, int, int, tuple[str, ...] | None]] = [
        *(("nvimgcodec", args.batch, t, None) for t in threads if nv_ok),
        *(("torchvision", args.batch, t, None) for t in threads),
        *(("nvimgcodec", args.big_batch, t, None) for t in threads if nv_ok),
        *(("nvimgcodec", args.batch, t, ("HYBRID_CPU_GPU",)) for t in (1, 4) if nv_ok)]
    default_backends: tuple[str, ...] = nvimgcodec_ops.GPU_BACKENDS if nv_ok else ()
    for name, size, nthreads, backends in plan:
        label = f"{name} b{size} x{nthreads}" + (f" {'+'.join(backends)}" if backends else "")
        if time.perf_counter() - T0 > args.budget:
            runs.append({"run": label, "skipped": f"time budget {args.budget} s spent"})
            continue
        with probe.step(label):
            if name == "nvimgcodec":
                nvimgcodec_ops.GPU_BACKENDS = backends or default_backends
            fn: Callable[..., Any] = nvimgcodec_ops.decode_jpegs if name == "nvimgcodec" \
                else jpeg_ops.decode_jpegs

            def decode(b: Any, fn: Callable[..., Any] = fn) -> Any:
                return fn(b, cuda)

            calls = max(1, args.calls * args.batch // size)
            r = measure(decode, batches_of(size, name == "nvimgcodec"),
                        nthreads, args.rounds, calls)
            runs.append({"run": label, "decoder": name, "batch": size,
                         "backends": list(backends or default_backends)
                         if name == "nvimgcodec" else None} | r)
            print(f"  {json.dumps(r)[:400]}", flush=True)
    if nv_ok:
        nvimgcodec_ops.GPU_BACKENDS = default_backends
    rec["loaded_libraries"] = loaded_libraries()

    print(f"\n{'run':<44} {'img/s':>8} {'call p50 ms':>12} {'p90 ms':>8} {'None':>5}")
    for r in runs:
        if "img_s" in r:
            print(f"{r['run']:<44} {r['img_s']:>8} {r['call_ms_p50']:>12} "
                  f"{r['call_ms_p90']:>8} {r['none_results']:>5}")
        else:
            why = str(r.get("error") or r.get("skipped")).splitlines()[0][:120]
            print(f"{r['run']:<44} {why}")
    probe.save()
    print("wrote", probe.path, flush=True)


if __name__ == "__main__":
    main()
