"""`trt-worker demo --task generation`: text-to-image end to end on one machine, GPU or not.

Starts a local Kafka unless brokers are configured (then the ``generation.topics`` must exist:
``trt-worker topics create --task generation``), runs a generation worker in a thread on the
tiny random-weights architecture unless weights are configured, sends two jobs of one image
each through ``generation.topics.jobs``, reads their results back, writes the PNGs to a folder
and prints a table of timings. The images are ``generation.sizes``' first size, 256x256 for the
tiny architecture unless sizes are configured: its UNet's self-attention at 512x512 (64x64
latents) took 1.4 s a step on 2 CPU cores, at 256x256 0.11 s. The engines go where
``generation.device`` resolves (the CPU without a CUDA device), warmed by first use on the CPU,
so the first image comes back in seconds.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from worker.config import WorkerConfig
from worker.config.generation import SizeSettings
from worker.loop.build import build_worker
from worker.tasks.generation.device import resolve_device
from worker.tools.demo import local_brokers
from worker.tools.generate import (
    AnswerReader,
    Answers,
    GenerateRequest,
    build_jobs,
    save_images,
    send_generation_jobs,
)

PROMPTS = ("a red sports car on a coastal road", "a lighthouse on a cliff at dusk")
TINY_SIDE = 256
STEPS = 20
SEED = 1


@dataclass(slots=True)
class DemoRun:
    """What the demo sent and got back (for its table, and for tests)."""

    ids: list[str]
    answers: Answers
    out_dir: Path
    size: tuple[int, int] = (0, 0)
    device: str = ""
    warm_up: str = ""
    start_s: float = 0.0  # worker thread start -> its task warm (engines loaded)
    answer_s: float = 0.0  # jobs sent -> every answer read back (or the timeout)
    files: dict[str, list[str]] = field(default_factory=dict)  # job id -> lines, one an image

    @property
    def ok(self) -> bool:
        return bool(self.ids) and all(self.answers.results.get(i, {}).get("status") == "ok"
                                      for i in self.ids)


def demo_config(cfg: WorkerConfig) -> WorkerConfig:
    """``cfg`` serving generation; the tiny random architecture at 256x256 unless weights
    (or sizes) are set."""
    g = cfg.generation
    if g.weights_dir is None and g.random_weights is None:
        g = g.model_copy(update={"random_weights": "tiny"})
    if g.random_weights == "tiny" and "sizes" not in g.model_fields_set:
        g = g.model_copy(update={"sizes": [SizeSettings(width=TINY_SIDE, height=TINY_SIDE)]})
    return cfg.model_copy(update={
        "generation": g, "processing": cfg.processing.model_copy(update={"task": "generation"})})


def run_generation_demo(cfg: WorkerConfig, *, out_dir: Path | None, timeout_s: float,
                        console: Console | None = None) -> DemoRun:
    """Serve, send, read back, save, summarise. Raises what the worker raised (a ConfigError
    for a device or backend this machine lacks) instead of waiting out the timeout."""
    console = console or Console()
    cfg = demo_config(cfg)
    resolve_device(cfg.generation)  # a device this machine lacks fails before Kafka starts
    out = out_dir or Path(tempfile.mkdtemp(prefix="ktw-demo-generation-"))
    t = cfg.generation.topics
    with local_brokers(cfg, console, {t.jobs: 1, t.results: 1, t.dlq: 1}) as cfg:
        worker = build_worker(cfg)  # resolves generation.device: fails here if it cannot run
        g = worker.task.settings
        run = DemoRun([], Answers(), out, (g.sizes[0].width, g.sizes[0].height), g.device,
                      g.warm_up)
        console.print(f"generation engines on {g.device} ({g.backend}, "
                      f"{g.effective_precision}), warm-up {g.warm_up}, model "
                      f"{worker.task.model_id}")
        failed: list[Exception] = []

        def serve() -> None:
            try:
                worker.run()
            except Exception as exc:  # noqa: BLE001 - handed over, re-raised after the join
                failed.append(exc)

        thread = threading.Thread(target=serve, name="worker", daemon=True)
        started = time.monotonic()
        thread.start()
        try:
            _exchange(cfg, run, worker, thread, started, timeout_s)
        finally:
            worker.stop()
            thread.join(timeout=60)
        if failed:
            raise failed[0]
        for job_id in run.ids:
            result = run.answers.results.get(job_id)
            if result is not None:
                run.files[job_id] = save_images(result, out, g.blob.local_dir)
    _summarise(run, console)
    return run


def _exchange(cfg: WorkerConfig, run: DemoRun, worker: Any, thread: threading.Thread,
              started: float, timeout_s: float) -> None:
    """Send the jobs once the worker is warm; read until answered, timed out or the worker
    thread ended (its error is raised by the caller)."""
    deadline = started + timeout_s
    while not worker.vitals.warm and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    run.start_s = time.monotonic() - started
    if not thread.is_alive():
        return
    prefix = f"demo-gen-{uuid.uuid4().hex[:6]}"
    width, height = run.size
    jobs = [job for i, prompt in enumerate(PROMPTS) for job in build_jobs(GenerateRequest(
        prompt, width=width, height=height, steps=STEPS, seed=SEED + i,
        job_id=f"{prefix}-{i}"))]
    run.ids = [job_id for job_id, _ in jobs]
    t = cfg.generation.topics
    with AnswerReader(cfg, t.results, t.dlq) as reader:
        sent = time.monotonic()
        send_generation_jobs(cfg, t.jobs, jobs)
        want = set(run.ids)
        while (not want <= run.answers.answered() and thread.is_alive()
               and time.monotonic() < deadline):
            reader.wait(want, min(1.0, max(0.0, deadline - time.monotonic())), run.answers)
        run.answer_s = time.monotonic() - sent


def _summarise(run: DemoRun, console: Console) -> None:
    table = Table(title=f"text to image on {run.device}, {run.size[0]}x{run.size[1]}, "
                        f"{STEPS} steps; timings in ms")
    for col in ("job", "status", "images", "text", "denoise", "vae", "png", "total"):
        table.add_column(col, justify="left" if col in ("job", "status") else "right",
                         no_wrap=col == "job")
    random = False
    for job_id in run.ids:
        if job_id in run.answers.dead:
            table.add_row(job_id, f"[red]dead-lettered: {run.answers.dead[job_id]}[/]",
                          *[""] * 6)
            continue
        r = run.answers.results.get(job_id)
        if r is None:
            table.add_row(job_id, "[red]missing[/]", *[""] * 6)
            continue
        random = random or bool(r.get("random_weights"))
        t = r.get("timings_ms", {})
        table.add_row(job_id, r["status"], str(len(r.get("images", []))),
                      *(f"{t.get(k, 0.0):.0f}" for k in ("text", "denoise", "vae", "png",
                                                         "total")))
    console.print(table)
    for job_id, prompt in zip(run.ids, PROMPTS, strict=True):
        for line in run.files.get(job_id, []):
            console.print(f"{job_id} ({prompt!r}) {line.strip()}", soft_wrap=True)
    answered = sum(1 for i in run.ids if i in run.answers.results)
    console.print(f"{answered}/{len(run.ids)} answered in {run.answer_s:.1f} s (worker warm "
                  f"after {run.start_s:.1f} s, warm-up {run.warm_up}); PNGs in {run.out_dir}"
                  + (" (RANDOM weights: the images are noise)" if random else ""),
                  soft_wrap=True)
