"""The GPU stages alone on HD frames (bench/frames.py's corpus of real photographs): JPEG decode
per backend, decode + resize + crop as the worker does it, the engine alone and the worker's whole
batch path, per frame class, in one process; and CPU/GPU parity on the same frames.

Per class (``--classes``, default thumb,720p,1080p at quality 85), batches of ``--batch`` frames
from 1 and 4 threads (each thread its own CUDA stream and, for nvImageCodec, its own decoder):

    tv_decode        torchvision's batched nvJPEG decode (the worker's default GPU decoder)
    tv_prep          the worker's prepare_batch with it: CPU header checks, decode, resize, crop
    nvc_hw_decode    nvImageCodec, hardware engines only (baseline JPEGs)
    nvc_hw_reuse_decode  the same into the thread's Images of the previous call (no new
                     output buffers: on the H200 nvc_hw_decode did 1.8k 1080p img/s against
                     torchvision's 4.9k, and allocating each output is the first suspect)
    nvc_hw_raw_decode    hardware decode, the Images not wrapped as tensors (DLPack's cost)
    nvc_hw8_raw_decode   that with eight host threads in the decoder instead of two
    nvc_decode       nvImageCodec as the worker configures it (hardware, then CUDA, hybrid)
    nvc_prep         the worker's prepare_batch with model.gpu_jpeg_decoder = nvimgcodec
    dali_decode      nvImageCodec configured as DALI's fn.decoders.image configures it (hardware
                     load 0.65, then CUDA, hybrid and CPU backends): DALI's own decoder core,
                     standing in for DALI (DALI itself: bench/moderation/dali_stage.py)
    dali_prep        that decode + the same resize and crop
    wdali_decode     DALI itself as the worker calls it (model.gpu_jpeg_decoder = dali:
                     jpeg_ops.decode_jpegs_dali, a pipeline per batch in flight)
    wdali_prep       the worker's prepare_batch with it
    cpu_checks       the GPU path's CPU work per frame (plain check, size, decode budget);
                     ``--cpu-checks-only``: that alone, with and without a second search for
                     scan markers, on any machine
    engine           graph replays of the pipeline's slot (batch ``--batch``) from device memory
    task             the worker's batch path (parts -> decode -> slot -> graph -> D2H), 4 in flight,
                     once per GPU decoder

Each measurement runs ``--reps`` times; every rate is kept (``rates``) with the median. Parity:
the CPU path's 224x224 crops (Pillow) against each GPU decoder's, max and mean |difference|.

    python bench/moderation/frames_gpu.py --cache .frames --out DIR     (GPU machine)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import frames as frame_corpus
from bench.common import environment, write


def _threads(work: list[Any], threads: int, fn: Callable[[Any], int]) -> float:
    """Items/s when ``threads`` threads (one CUDA stream each) split ``work`` and call ``fn``
    on each piece (it returns the items it did); the clock stops when every stream is done."""
    import torch

    barrier = threading.Barrier(threads + 1)
    done = [0] * threads
    errors: list[BaseException] = []

    def run(k: int) -> None:
        stream = torch.cuda.Stream()
        try:
            barrier.wait()
            with torch.cuda.stream(stream):
                for piece in work[k::threads]:
                    done[k] += fn(piece)
            stream.synchronize()
        except BaseException as exc:  # noqa: BLE001  (reported by the caller)
            errors.append(exc)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(done) / dt


def _nvc_decoder(kind: str) -> Any:
    from nvidia import nvimgcodec as nvc

    b = nvc.BackendKind
    if kind == "hw8":  # the same engines, eight host threads for parsing and submission
        return nvc.Decoder(device_id=0, max_num_cpu_threads=8,
                           backends=[nvc.Backend(b.HW_GPU_ONLY)])
    if kind == "hw":
        backends = [nvc.Backend(b.HW_GPU_ONLY)]
    elif kind == "dali":  # fn.decoders.image's defaults (hw_decoder_load=0.65)
        backends = [nvc.Backend(b.HW_GPU_ONLY, load_hint=0.65), nvc.Backend(b.GPU_ONLY),
                    nvc.Backend(b.HYBRID_CPU_GPU), nvc.Backend(b.CPU_ONLY)]
    else:
        raise ValueError(kind)
    return nvc.Decoder(device_id=0, max_num_cpu_threads=2, backends=backends)


def _resize_crop(imgs: list[Any], out: Any) -> int:
    """The worker's resize + crop (models/open_nsfw/gpu_preprocess.py) of same-size CHW
    images into ``out``; how many."""
    import torch

    from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import resize_crop

    out[: len(imgs)] = resize_crop(torch.stack(imgs))
    return len(imgs)


def stage_rates(frames: list[bytes], batch: int, reps: int, threads: tuple[int, ...]
                ) -> dict[str, Any]:
    import torch

    from worker.tasks.moderation.images.jpeg_ops import (
        decode_jpegs,
        decode_jpegs_dali,
        decode_jpegs_nvimgcodec,
    )
    from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import prepare_batch

    dev = torch.device("cuda", 0)
    n_batches = max(8, 2048 // batch)
    batches = [[frames[(i * batch + j) % len(frames)] for j in range(batch)]
               for i in range(n_batches)]
    raw = [[torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in b] for b in batches]
    local = threading.local()

    def out_rows() -> Any:
        if getattr(local, "out", None) is None:
            local.out = torch.empty((batch, 224, 224, 3), dtype=torch.uint8, device=dev)
        return local.out

    def nvc(kind: str) -> Any:
        key = f"dec_{kind}"
        if getattr(local, key, None) is None:
            setattr(local, key, _nvc_decoder(kind))
        return getattr(local, key)

    def nvc_decode(kind: str, b: list[bytes], reuse: bool = False, raw: bool = False
                   ) -> list[Any]:
        """``reuse``: decode into this thread's Images of the previous call (their device
        buffers kept) instead of new ones: whether allocating each output is what costs.
        ``raw``: the decoder's Images, not wrapped as tensors (what DLPack costs per image)."""
        from nvidia import nvimgcodec as nvc_mod

        params = nvc_mod.DecodeParams(apply_exif_orientation=False,
                                      color_spec=nvc_mod.ColorSpec.SRGB,
                                      sample_format=nvc_mod.SampleFormat.P_RGB)
        previous = getattr(local, f"imgs_{kind}", None) if reuse else None
        if previous is not None and len(previous) != len(b):
            previous = None
        imgs = nvc(kind).decode([nvc_mod.CodeStream(d) for d in b], params=params,
                                images=previous,
                                cuda_stream=torch.cuda.current_stream().cuda_stream)
        if reuse and all(i is not None for i in imgs):
            setattr(local, f"imgs_{kind}", imgs)
        if raw:
            return [i for i in imgs if i is not None]
        return [torch.utils.dlpack.from_dlpack(i) for i in imgs if i is not None]

    stages: dict[str, tuple[list[Any], Callable[[Any], int]]] = {
        "tv_decode": (raw, lambda b: len(decode_jpegs(b, dev))),
        "tv_prep": (batches, lambda b: len(b) - sum(
            r is not None for r in prepare_batch(b, out_rows(), None, "torchvision"))),
        "nvc_hw_decode": (batches, lambda b: len(nvc_decode("hw", b))),
        "nvc_hw_reuse_decode": (batches, lambda b: len(nvc_decode("hw", b, reuse=True))),
        "nvc_hw_raw_decode": (batches, lambda b: len(nvc_decode("hw", b, raw=True))),
        "nvc_hw8_raw_decode": (batches, lambda b: len(nvc_decode("hw8", b, raw=True))),
        "nvc_decode": (batches, lambda b: sum(
            t is not None for t in decode_jpegs_nvimgcodec(b, dev))),
        "nvc_prep": (batches, lambda b: len(b) - sum(
            r is not None for r in prepare_batch(b, out_rows(), None, "nvimgcodec"))),
        "dali_decode": (batches, lambda b: len(nvc_decode("dali", b))),
        "dali_prep": (batches, lambda b: _resize_crop(nvc_decode("dali", b), out_rows())),
        "wdali_decode": (batches, lambda b: len(decode_jpegs_dali(b, dev))),
        "wdali_prep": (batches, lambda b: len(b) - sum(
            r is not None for r in prepare_batch(b, out_rows(), None, "dali"))),
    }
    out: dict[str, Any] = {}
    for name, (work, fn) in stages.items():
        for t in threads:
            key = f"{name}@{t}t"
            try:
                _threads(work[:t * 2], t, fn)  # warm: handles, kernels, decoders per thread
                rates = [round(_threads(work, t, fn)) for _ in range(reps)]
                out[key] = {"median": statistics.median(rates), "rates": rates}
            except Exception as exc:  # noqa: BLE001  (recorded; the other stages go on)
                out[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"  {key}: {out[key]}", flush=True)
    return out


def cpu_checks_rate(frames: list[bytes], reps: int, *, search_scans: bool = False
                    ) -> dict[str, Any]:
    """Frames/s of the CPU checks the GPU path makes per frame, in the worker's order: the
    plain check (the model's split), then decode_all's size check and decode budget, whose
    scan count the plain walk already made. ``search_scans``: the budget searches the bytes
    for scan markers again, as the worker did before it passed ``plain=True`` (kept to measure
    what that cost)."""
    from worker.tasks.moderation.images.budgets import admit, default_guard
    from worker.tasks.moderation.images.cpu import (
        MAX_FRAMES,
        MAX_SAMPLED_FRAMES,
        ImageLimits,
        check_dimensions,
        jpeg_dimensions,
        jpeg_plain,
    )

    lim = ImageLimits()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for d in frames * 4:
            assert jpeg_plain(d)
            dims = jpeg_dimensions(d)
            assert dims is not None
            check_dimensions(*dims, lim)
            admit(d, "JPEG", dims, 1, max_pixels=lim.max_pixels, max_frames=MAX_FRAMES,
                  sampled=MAX_SAMPLED_FRAMES, guard=lim.guard or default_guard(),
                  scans_checked=not search_scans)
        rates.append(round(len(frames) * 4 / (time.perf_counter() - t0)))
    return {"median": statistics.median(rates), "rates": rates, "threads": 1}


def parity(frames: list[bytes]) -> dict[str, Any]:
    """The CPU path's crops against each GPU decoder's, on the same frames."""
    import numpy as np
    import torch

    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import prepare_batch
    from worker.tasks.moderation.models.open_nsfw.preprocess import crop_pixels

    ref = np.stack([crop_pixels(decode_image(f), jpeg_roundtrip=False) for f in frames])
    out: dict[str, Any] = {"frames": len(frames)}
    for decoder in ("torchvision", "nvimgcodec", "dali"):
        try:
            rows = torch.zeros((len(frames), 224, 224, 3), dtype=torch.uint8, device="cuda")
            rejects = prepare_batch(frames, rows, None, decoder)
            got = rows.cpu().numpy().astype(np.int16)
            diff = np.abs(got - ref.astype(np.int16))
            out[decoder] = {"rejected": sum(r is not None for r in rejects),
                            "max_abs": int(diff.max()), "mean_abs": round(float(diff.mean()), 3),
                            "p99_abs": float(np.percentile(diff, 99))}
        except Exception as exc:  # noqa: BLE001
            out[decoder] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def task_rates(frames: list[bytes], batch: int, reps: int) -> dict[str, Any]:
    """The worker's batch path (bench/moderation/task_probe.py) and the engine alone, per GPU
    decoder, 4 batches in flight."""
    from bench.moderation.task_probe import (
        StepTimes,
        engine_alone,
        image_parts,
        make_model,
        run_batches,
    )

    out: dict[str, Any] = {}
    for decoder in ("torchvision", "nvimgcodec", "dali"):
        os.environ["BENCH_WORKER_OVERRIDES"] = json.dumps(
            {"model": {"gpu_jpeg_decoder": decoder}})
        try:
            cfg, model = make_model(dry_run=False)
            items = image_parts(cfg, model, frames, batch * max(8, 2048 // batch))
            run_batches(model, items[: batch * 4], batch, 4, StepTimes())  # warm
            rates = [run_batches(model, items, batch, 4, StepTimes())["img_s"]
                     for _ in range(reps)]
            out[f"task_{decoder}"] = {"median": statistics.median(rates), "rates": rates}
            if "engine" not in out:
                eng = [engine_alone(model, batch, 100) for _ in range(reps)]
                out["engine"] = {"median": statistics.median(eng), "rates": eng}
            model.close()
        except Exception as exc:  # noqa: BLE001
            out[f"task_{decoder}"] = {"error": f"{type(exc).__name__}: {exc}"[:300],
                                      "trace": traceback.format_exc()[-1500:]}
        print(f"  task {decoder}: {out.get(f'task_{decoder}')} engine {out.get('engine')}",
              flush=True)
    os.environ.pop("BENCH_WORKER_OVERRIDES", None)
    return out


def hardware_decoders() -> dict[str, Any]:
    """The NVJPG engines nvJPEG reports (nvjpegGetHardwareDecoderInfo), by ctypes."""
    import ctypes
    import glob

    libs = glob.glob(os.path.join(sys.prefix, "lib/python3*/site-packages/nvidia/cu13/lib/"
                                  "libnvjpeg.so*"))
    libs += [*glob.glob("/tmp/site/nvidia/cu13/lib/libnvjpeg.so*"), "libnvjpeg.so.13"]
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        handle = ctypes.c_void_p()
        backend_hw = 3  # NVJPEG_BACKEND_HARDWARE
        rc = lib.nvjpegCreateEx(backend_hw, None, None, 0, ctypes.byref(handle))
        if rc != 0:
            return {"lib": path, "create_hardware_status": rc}
        engines, cores = ctypes.c_uint(), ctypes.c_uint()
        rc = lib.nvjpegGetHardwareDecoderInfo(handle, ctypes.byref(engines), ctypes.byref(cores))
        lib.nvjpegDestroy(handle)
        return {"lib": path, "status": rc, "engines": engines.value,
                "cores_per_engine": cores.value}
    return {"error": "libnvjpeg not found"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", default="thumb,720p,1080p")
    ap.add_argument("--quality", type=int, default=85)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--skip-task", action="store_true")
    ap.add_argument("--cpu-checks-only", action="store_true",
                    help="only the per-frame CPU checks, with and without the second scan "
                         "search (no GPU needed)")
    ap.add_argument("--cache", type=Path, default=frame_corpus.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    threads = tuple(int(t) for t in args.threads.split(","))
    record: dict[str, Any] = {"benchmark": "frames_gpu_stages", "env": environment(),
                              "params": {k: str(v) for k, v in vars(args).items()},
                              "hardware_decoders": hardware_decoders(), "classes": {}}
    print("hardware decoders:", record["hardware_decoders"], flush=True)
    manifest = frame_corpus.build(args.cache)
    record["frames_manifest"] = manifest
    path: Path | None = None
    for cls in args.classes.split(","):
        frames = frame_corpus.load(cls, args.quality, args.cache)
        print(f"{cls}: {frame_corpus.stream_record(frames)}", flush=True)
        c: dict[str, Any] = {"frames": frame_corpus.stream_record(frames)}
        c["cpu_checks"] = cpu_checks_rate(frames, args.reps)
        print(f"  cpu_checks: {c['cpu_checks']}", flush=True)
        if args.cpu_checks_only:
            c["cpu_checks_scan_search"] = cpu_checks_rate(frames, args.reps, search_scans=True)
            print(f"  cpu_checks_scan_search: {c['cpu_checks_scan_search']}", flush=True)
        else:
            c["stages"] = stage_rates(frames, args.batch, args.reps, threads)
            c["parity"] = parity(frames[:16])
            print(f"  parity: {c['parity']}", flush=True)
            if not args.skip_task:
                c.update(task_rates(frames, args.batch, args.reps))
        record["classes"][cls] = c
        # After each class, into one file: a run cut off by its time limit keeps what it did.
        path = path or write("frames-gpu", record, args.out)
        path.write_text(json.dumps(record, indent=2, sort_keys=True))
        print("wrote", path, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
