"""Does an SM partition (a CUDA green context, engines.gpu_partition) keep a latency-bound
task's kernels from waiting behind a throughput task's kernels, and what does it cost?

No broker, no worker: the two tasks' kernel shapes alone. The background is a UNet-like
graph (3x3 convolutions and a projection, fp16, batch 8 at 64x64 latents with 320 channels)
replayed back to back from a thread, two replays in flight; the foreground is torchvision's
ResNet-50 (open_nsfw's shape) in fp16, batch 16 at 224, on a most-urgent stream of the
primary context, one batch every ``--period-ms``, its latency from launch to its event.

Checks first: a matmul loop timed on the whole device and in partitions (does a partition
limit the kernels?), and a CUDA graph captured on a partition's stream and one captured on
an ordinary stream, each replayed on the partition's stream (does a graph keep the
partition it was captured in?). Then, per configuration (no background; background on an
ordinary stream; background in partitions leaving ``--leave`` SMs free): the foreground's
latencies (raw, all kept) and the background's replays per second.

python bench/generation/green_probe.py [--seconds 4] [--period-ms 5] [--leave 8,16,32]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, write


def _timed(torch: Any, fn: Any, stream: Any, reps: int) -> float:
    """Milliseconds per call of ``fn`` on ``stream`` (after one untimed call)."""
    with torch.cuda.stream(stream):
        fn()
        stream.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        stream.synchronize()
    return (time.perf_counter() - t) * 1e3 / reps


def _quantiles(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    if not s:
        return {}

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, int(p * len(s)))], 3)

    return {"n": len(s), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": round(s[-1], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--period-ms", type=float, default=5.0)
    ap.add_argument("--leave", default="8,16,32", help="SMs a partition leaves free, each")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import torch
    import torchvision

    from engines.cudart import greatest_stream_priority
    from engines.gpu_partition import device_sms, sm_partition

    torch.cuda.init()
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda", 0)
    total, align = device_sms(0)
    record: dict[str, Any] = {"bench": "green_probe", "env": environment(),
                              "params": vars(args) | {"out": None},
                              "sms": {"total": total, "align": align}}
    print(f"SMs {total}, partition granularity {align}", flush=True)
    leaves = [int(x) for x in args.leave.split(",") if x]
    parts = {leave: sm_partition(leave) for leave in leaves}
    pstreams = {leave: torch.cuda.ExternalStream(p.stream()) for leave, p in parts.items()}
    record["partitions"] = {str(k): {"sms": p.sms, "left": p.left} for k, p in parts.items()}
    print("partitions", record["partitions"], flush=True)
    plain = torch.cuda.Stream()

    # 1. Does a partition limit the kernels? fp16 matmul, 8192^3.
    mats = [torch.randn(8192, 8192, device=dev, dtype=torch.float16) for _ in range(2)]

    def mm() -> None:
        torch.mm(mats[0], mats[1])

    scale = {"whole": _timed(torch, mm, plain, 20)}
    for leave, s in pstreams.items():
        scale[f"leave{leave}"] = _timed(torch, mm, s, 20)
    record["matmul_ms"] = {k: round(v, 3) for k, v in scale.items()}
    print("matmul ms", record["matmul_ms"], flush=True)

    # 2. Does a captured graph keep its partition? Captured in the tightest partition, and
    #    captured on an ordinary stream, both replayed on that partition's stream.
    tight = max(leaves)
    ts = pstreams[tight]

    def loop() -> None:
        for _ in range(5):
            torch.mm(mats[0], mats[1])

    graphs = {}
    for where, cap in (("captured_in_partition", ts), ("captured_plain", torch.cuda.Stream())):
        with torch.cuda.stream(cap):
            loop()
        cap.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=cap):
            loop()
        graphs[where] = g
    graph_ms = {}
    for where, g in graphs.items():
        graph_ms[f"{where}_replayed_in_partition"] = _timed(torch, g.replay, ts, 5) / 5
        graph_ms[f"{where}_replayed_plain"] = _timed(torch, g.replay, plain, 5) / 5
    record["graph_matmul_ms"] = {k: round(v, 3) for k, v in graph_ms.items()}
    print(f"graph per matmul ms (partition leaves {tight})", record["graph_matmul_ms"],
          flush=True)
    mats.clear()

    # 3. Interference: UNet-like background against a ResNet-50 foreground.
    x = torch.randn(8, 320, 64, 64, device=dev, dtype=torch.float16).to(
        memory_format=torch.channels_last)
    convs = [torch.nn.Conv2d(320, 320, 3, padding=1).to(dev, torch.float16).to(
        memory_format=torch.channels_last) for _ in range(6)]
    proj = torch.nn.Linear(320, 1280).to(dev, torch.float16)

    @torch.no_grad()
    def unet_like() -> None:
        h = x
        for c in convs:
            h = torch.nn.functional.silu(c(h))
        proj(h.permute(0, 2, 3, 1).reshape(-1, 320))

    def bg_graph(stream: Any) -> Any:
        with torch.cuda.stream(stream):
            for _ in range(3):
                unet_like()
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            unet_like()
        return g

    net = torchvision.models.resnet50().to(dev, torch.float16).eval().to(
        memory_format=torch.channels_last)
    fg_in = torch.randn(16, 3, 224, 224, device=dev, dtype=torch.float16).to(
        memory_format=torch.channels_last)
    urgent = torch.cuda.Stream(priority=greatest_stream_priority())

    def fg_once() -> float:
        done = torch.cuda.Event()
        t = time.perf_counter()
        with torch.no_grad(), torch.cuda.stream(urgent):
            net(fg_in)
            done.record(urgent)
        done.synchronize()
        return (time.perf_counter() - t) * 1e3

    for _ in range(10):
        fg_once()

    def measure(stream: Any | None) -> dict[str, Any]:
        stop = threading.Event()
        replays = [0]
        g = bg_graph(stream) if stream is not None else None

        def background() -> None:
            assert g is not None and stream is not None
            with torch.cuda.stream(stream):
                prev = None
                while not stop.is_set():
                    g.replay()
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    if prev is not None:
                        prev.synchronize()
                    prev = ev
                    replays[0] += 1
                stream.synchronize()

        th = threading.Thread(target=background, daemon=True) if g is not None else None
        if th is not None:
            th.start()
            time.sleep(0.3)
        lat: list[float] = []
        t0 = time.perf_counter()
        n0 = replays[0]
        end = t0 + args.seconds
        nxt = t0
        while time.perf_counter() < end:
            lat.append(fg_once())
            nxt += args.period_ms / 1e3
            time.sleep(max(0.0, nxt - time.perf_counter()))
        span = time.perf_counter() - t0
        rate = (replays[0] - n0) / span
        stop.set()
        if th is not None:
            th.join()
        return {"fg_ms": _quantiles(lat), "fg_raw_ms": [round(v, 3) for v in lat],
                "bg_replays_per_s": round(rate, 2)}

    def bg_alone(stream: Any) -> float:
        g = bg_graph(stream)
        return _timed(torch, g.replay, stream, 50)

    configs: dict[str, Any] = {"fg_alone": measure(None)}
    configs["bg_plain"] = measure(plain) | {"bg_alone_ms": round(bg_alone(plain), 3)}
    for leave, s in pstreams.items():
        configs[f"bg_leave{leave}"] = measure(s) | {"bg_alone_ms": round(bg_alone(s), 3)}
    configs["fg_alone_after"] = measure(None)
    record["interference"] = configs
    for k, v in configs.items():
        print(k, v["fg_ms"], "bg/s", v["bg_replays_per_s"], "alone ms", v.get("bg_alone_ms"),
              flush=True)
    for p in parts.values():
        p.close()
    path = write("green-probe", record, args.out)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
