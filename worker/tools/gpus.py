"""`trt-worker run --gpus N|all [--procs-per-gpu K]`: K worker processes per GPU on this host
(one by default), stopped together.

Each child is a plain `trt-worker run` with one GPU visible (``CUDA_VISIBLE_DEVICES``), its own
instance id (``<instance_id>-gpu<i>``, with K > 1 ``<instance_id>-gpu<i>-<j>``: stable when the
base is, e.g. a StatefulSet pod name) and its own metrics port (``metrics.port + n``, n counting
the children). Several processes per GPU trade latency for throughput: each has its own
nvJPEG decoder, Python loop and CUDA context, which the GPU time-slices unless they run under
MPS (``--mps``, :mod:`worker.tools.mps`; figures in docs/performance.md). SIGTERM/SIGINT are
passed on to every child;
when one child exits non-zero the others are stopped and its exit code is returned, so an
orchestrator restarts the group as one unit (a pod) instead of running on with a GPU idle.
Processes, not threads: each worker's host path is GIL-bound and its own CUDA context.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

import structlog

from worker.config import WorkerConfig
from worker.exceptions import ConfigError

log = structlog.get_logger("worker")


def visible_gpus(spec: str) -> list[str]:
    """The device ids to give one child each: ``all`` (every GPU ``nvidia-smi -L`` lists, or
    those ``CUDA_VISIBLE_DEVICES`` names) or a count (the first N of them; on a machine
    where none can be listed, 0..N-1)."""
    listed = _listed_gpus()
    if spec == "all":
        if not listed:
            raise ConfigError("--gpus all: no GPU found (nvidia-smi lists none and "
                              "CUDA_VISIBLE_DEVICES is unset)")
        return listed
    try:
        n = int(spec)
    except ValueError:
        raise ConfigError(f"--gpus takes a count or 'all', not {spec!r}") from None
    if n < 1:
        raise ConfigError("--gpus must be at least 1")
    if listed and n > len(listed):
        raise ConfigError(f"--gpus {n}: only {len(listed)} GPU(s) here ({', '.join(listed)})")
    return listed[:n] if listed else [str(i) for i in range(n)]


def _listed_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def child_env(cfg: WorkerConfig, device: str, index: int, slot: int = 0, per_gpu: int = 1,
              extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of process ``slot`` (of ``per_gpu``) on the ``index``-th device
    (``extra``: e.g. the MPS daemon's pipe folder, :mod:`worker.tools.mps`)."""
    env = dict(os.environ) | (extra or {})
    env["CUDA_VISIBLE_DEVICES"] = device
    suffix = f"-gpu{index}" if per_gpu == 1 else f"-gpu{index}-{slot}"
    env["KTW_KAFKA__INSTANCE_ID"] = cfg.kafka.instance_id + suffix
    n = index * per_gpu + slot
    env["KTW_METRICS__PORT"] = str(cfg.metrics.port + n if cfg.metrics.port else 0)
    return env


def supervise(cfg: WorkerConfig, devices: Sequence[str], argv: Sequence[str],
              poll_s: float = 0.2, per_gpu: int = 1, env: dict[str, str] | None = None
              ) -> int:
    """Run ``argv`` ``per_gpu`` times per device and wait; the exit code is the first
    failure's, else 0."""
    if per_gpu < 1:
        raise ConfigError("--procs-per-gpu must be at least 1")
    last_port = cfg.metrics.port + len(devices) * per_gpu - 1
    if cfg.metrics.port and last_port > 65535:
        raise ConfigError(f"metrics.port {cfg.metrics.port} leaves no room for "
                          f"{len(devices) * per_gpu} processes (the last would be {last_port})")
    children = [subprocess.Popen(list(argv), env=child_env(cfg, d, i, j, per_gpu, env))
                for i, d in enumerate(devices) for j in range(per_gpu)]
    log.info("gpu_workers_started", devices=list(devices),
             pids=[c.pid for c in children])
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for c in children:
            if c.poll() is None:
                c.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        failed: int | None = None
        while [c.poll() for c in children].count(None):  # (every child polled: no any())
            bad = [c for c in children if c.returncode not in (None, 0)]
            if bad and failed is None:
                failed = bad[0].returncode
                log.error("gpu_worker_failed", pid=bad[0].pid, exit_code=failed,
                          stopping_others=True)
                forward(signal.SIGTERM, None)
            time.sleep(poll_s)
        codes = [c.returncode for c in children]
        log.info("gpu_workers_stopped", exit_codes=codes, requested=stopping)
        if failed is not None:
            return failed
        return next((code for code in codes if code != 0), 0)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# The children must not supervise again (nor start MPS).
SUPERVISOR_OPTIONS = ("--gpus", "--procs-per-gpu")
SUPERVISOR_FLAGS = ("--mps", "--no-mps")


def child_argv(argv: Sequence[str]) -> list[str]:
    """This command line without ``--gpus``, ``--procs-per-gpu`` and their values, and
    without ``--mps``: what each child runs."""
    out, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if arg in SUPERVISOR_OPTIONS:
            skip = True
            continue
        if arg in SUPERVISOR_FLAGS:
            continue
        if arg.startswith(tuple(f"{o}=" for o in SUPERVISOR_OPTIONS)):
            continue
        out.append(arg)
    return [sys.executable, "-m", "worker", *out]
