"""The `trt-worker` command line."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from worker.config import WorkerConfig, load_config
from worker.exceptions import ConfigError, WorkerError
from worker.logs import configure_logging
from worker.observe.stacks import install_stack_dump, write_stacks
from worker.tools.options import ConfigOpt

# Locals stay out of tracebacks whatever typer's default: a frame's locals can hold the client
# settings, secrets in the clear.
app = typer.Typer(add_completion=False, no_args_is_help=True,
                  pretty_exceptions_show_locals=False,
                  help="Kafka worker for batched GPU/CPU inference (moderation and generation "
                       "jobs).")

BootstrapOpt = Annotated[
    str | None, typer.Option("--bootstrap-servers", "-b", help="Kafka brokers host:port,...")
]
# The jobs' `v`; the worker answers each job in its version. v1 is the default until it is
# removed (docs/wire-contract.md).
SchemaVersionOpt = Annotated[int, typer.Option(
    min=1, max=2, help="Contract version of the jobs (1 or 2); results follow it.")]


def _config(config: Path | None, bootstrap: str | None, **extra: Any) -> WorkerConfig:
    overrides: dict[str, Any] = dict(extra)
    if bootstrap:
        overrides["kafka"] = {"bootstrap_servers": bootstrap}
    cfg = load_config(config, **overrides)
    configure_logging(cfg.log.level, cfg.log.format)
    return cfg


# How much later than the shutdown timeout faulthandler's own watchdog ends the process when
# no Python thread can run any more (a C call holding the GIL).
BACKSTOP_S = 10.0


def _exit_after(timeout_s: float) -> None:
    """A drain that hangs ends with every thread's stack on stderr and exit code 1. The stacks
    are read by this thread holding the GIL (worker.observe.stacks): faulthandler's own
    watchdog reads them without it, and in CI it crashed (exit -11) on the frame of a decode
    thread that was still running."""
    time.sleep(timeout_s)
    try:
        # The header faulthandler's watchdog writes (log readers look for it).
        sys.stderr.write(f"Timeout ({datetime.timedelta(seconds=timeout_s)})!\n")
        write_stacks("Stacks at the shutdown timeout", current=threading.get_ident())
    finally:
        os._exit(1)


_shutdown_armed = threading.Lock()


def _arm_shutdown_timeout(timeout_s: float) -> None:
    """From now on the process has ``timeout_s`` to end (the first call only counts)."""
    if not _shutdown_armed.acquire(blocking=False):
        return
    threading.Thread(target=_exit_after, args=(timeout_s,), daemon=True,
                     name="shutdown-timeout").start()
    faulthandler.dump_traceback_later(timeout_s + BACKSTOP_S, exit=True)


def _install_stop_handlers(stop: Any, shutdown_timeout_s: float) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        # A second signal falls through to the default action (immediate exit).
        signal.signal(signum, signal.SIG_DFL)
        _arm_shutdown_timeout(shutdown_timeout_s)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    # `kill -USR1 <pid>` prints every thread's stack to stderr and the worker runs on: the
    # first thing to look at when a worker stops making progress or does not stop.
    install_stack_dump(signal.SIGUSR1)


@app.command()
def run(
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    task: Annotated[str | None, typer.Option(
        help="What to serve: moderation or generation, or both in one process "
             "(moderation,generation: docs/two-tasks.md) (default: processing.task).")] = None,
    gpus: Annotated[str | None, typer.Option(
        help="One worker process per GPU: a count or 'all' (instance ids <id>-gpu<i>, "
             "metrics ports metrics.port + n, n counting the processes); stopped "
             "together.")] = None,
    procs_per_gpu: Annotated[int, typer.Option(
        min=1, help="With --gpus: this many worker processes per GPU (instance ids "
                    "<id>-gpu<i>-<j>): more throughput, higher latency (docs/operations.md).")] = 1,
    mps: Annotated[bool, typer.Option(
        help="With --gpus: run the processes under a private NVIDIA MPS daemon, so their "
             "GPU work runs concurrently instead of time-sliced (leave out where MPS "
             "already runs).")] = False,
) -> None:
    """Run the worker against the configured brokers until SIGTERM/SIGINT."""
    from worker.loop.build import build_worker
    from worker.observe.attach import observe

    cfg = _config(config, bootstrap_servers,
                  **({"processing": {"task": task}} if task is not None else {}))
    if not cfg.kafka.bootstrap_servers:
        raise WorkerError("no brokers configured: set KAFKA_BOOTSTRAP_SERVERS or pass "
                          "--bootstrap-servers (or try `trt-worker demo`)")
    if (procs_per_gpu != 1 or mps) and gpus is None:
        raise ConfigError("--procs-per-gpu and --mps need --gpus (a count or 'all')")
    if gpus is not None:
        from worker.tools.gpus import child_argv, supervise, visible_gpus
        from worker.tools.mps import MpsDaemon

        devices = visible_gpus(gpus)
        daemon = MpsDaemon(devices) if mps else None
        with daemon or contextlib.nullcontext(None) as env:
            code = supervise(cfg, daemon.client_devices() if daemon else devices,
                             child_argv(sys.argv), per_gpu=procs_per_gpu, env=env)
        raise typer.Exit(code)
    if len(cfg.processing.tasks) > 1:
        _run_tasks(cfg)
        return
    worker = build_worker(cfg)
    _serve(worker, lambda: observe(worker), cfg.commit.shutdown_timeout_s)


def _serve(loop: Any, observe_it: Callable[[], Any], shutdown_timeout_s: float) -> None:
    """Run ``loop`` (a Worker or TaskThreads) until it ends: SIGTERM/SIGINT stop it, within
    ``shutdown_timeout_s``; ``observe_it()`` serves its metrics and health meanwhile."""
    _install_stop_handlers(loop.stop, shutdown_timeout_s)
    server = observe_it()
    try:
        loop.run()
    finally:
        if server is not None:
            server.close()


def _run_tasks(cfg: WorkerConfig) -> None:
    """Several tasks in this process, a loop each (worker.loop.task_threads): SIGTERM stops
    them all; one failing stops the others, and the exit names it (TaskLoopFailed)."""
    from worker.loop.build import build_workers
    from worker.loop.task_threads import TaskThreads
    from worker.observe.attach import observe_all

    workers = build_workers(cfg)
    # A loop's failure drains the others, bounded as a SIGTERM's drain is.
    loops = TaskThreads(workers, on_own_stop=lambda: _arm_shutdown_timeout(
        cfg.commit.shutdown_timeout_s))
    _serve(loops, lambda: observe_all(workers), cfg.commit.shutdown_timeout_s)


@app.command()
def produce(
    folder: Annotated[Path, typer.Argument(help="Folder of .jpg/.png/.webp images.")],
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    topic: Annotated[str | None, typer.Option(help="Jobs topic (default: config).")] = None,
    count: Annotated[int | None, typer.Option(min=1, help="Jobs to send (cycles).")] = None,
    prefix: Annotated[str, typer.Option(help="Job id prefix.")] = "job-",
    policy: Annotated[str | None, typer.Option(help="Policy name for every job.")] = None,
    deadline_ms: Annotated[
        int | None, typer.Option(min=0, help="Deadline, milliseconds from now.")
    ] = None,
    schema_version: SchemaVersionOpt = 1,
) -> None:
    """Send the images of a folder as moderation jobs."""
    from worker.tools.produce import produce_folder

    cfg = _config(config, bootstrap_servers)
    sent = produce_folder(cfg, folder, topic=topic, count=count, prefix=prefix, policy=policy,
                          deadline_in_ms=deadline_ms, version=schema_version)
    typer.echo(f"produced {len(sent)} jobs to {topic or cfg.topics.jobs}")


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="What to draw.")],
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    n: Annotated[int | None, typer.Option("--n", "-n", min=1,
                                          help="Images per job (default 1).")] = None,
    width: Annotated[int | None, typer.Option(help="Width in pixels (default 512).")] = None,
    height: Annotated[int | None, typer.Option(help="Height in pixels (default 512).")] = None,
    steps: Annotated[int | None, typer.Option(help="Denoising steps (default 30).")] = None,
    scheduler: Annotated[str | None, typer.Option(
        help="ddim, euler or euler_a (default ddim).")] = None,
    seed: Annotated[int | None, typer.Option(
        help="Seed of image 0; image i uses seed + i (default: derived from the job id).")
    ] = None,
    guidance: Annotated[float | None, typer.Option(
        help="Classifier-free guidance scale (default 7.5).")] = None,
    negative: Annotated[str | None, typer.Option(help="Negative prompt.")] = None,
    count: Annotated[int, typer.Option(min=1, help="Jobs to send (each with --n images).")] = 1,
    job_id: Annotated[str | None, typer.Option(
        "--id", help="Job id (several jobs: their id prefix). Default: random.")] = None,
    topic: Annotated[str | None, typer.Option(
        help="Jobs topic (default: generation.topics.jobs).")] = None,
    deadline_ms: Annotated[
        int | None, typer.Option(min=0, help="Deadline, milliseconds from now.")
    ] = None,
    wait: Annotated[bool, typer.Option(
        help="Wait for the results (or DLQ records) and print them.")] = False,
    out: Annotated[Path | None, typer.Option(
        help="Wait and write the images here as <id>-<index>-<seed>.png.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for answers.")] = 600.0,
    schema_version: SchemaVersionOpt = 1,
) -> None:
    """Send text-to-image jobs to a generation worker (`trt-worker run --task generation`)."""
    from worker.tools.generate import GenerateRequest, run_generate

    cfg = _config(config, bootstrap_servers)
    if not cfg.kafka.bootstrap_servers:
        raise WorkerError("no brokers configured: set KAFKA_BOOTSTRAP_SERVERS or pass "
                          "--bootstrap-servers")
    req = GenerateRequest(prompt, num_images=n, negative_prompt=negative, width=width,
                          height=height, steps=steps, guidance_scale=guidance,
                          scheduler=scheduler, seed=seed, jobs=count, job_id=job_id,
                          deadline_in_ms=deadline_ms, version=schema_version)
    ok = run_generate(cfg, req, topic=topic, wait=wait or out is not None, out_dir=out,
                      timeout_s=timeout, echo=typer.echo)
    raise typer.Exit(0 if ok else 1)


@app.command()
def demo(
    config: ConfigOpt = None,
    task: Annotated[str, typer.Option(
        help="moderation (sample images, open_nsfw verdicts) or generation (two images, "
             "256x256 from the tiny random-weights network unless generation weights or "
             "sizes are configured; needs the gen extra).")] = "moderation",
    images: Annotated[
        Path | None, typer.Option(help="Folder of images (default: bundled samples).")
    ] = None,
    out: Annotated[Path | None, typer.Option(
        help="--task generation: write the PNGs here (default: a new temporary folder).")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for every answer.")] = 180.0,
) -> None:
    """Start a local Kafka (unless one is configured), send sample jobs, print the answers."""
    cfg = _config(config, None, log={"level": "WARNING", "format": "console"})
    if task == "generation":
        if images is not None:
            raise ConfigError("--images is for the moderation demo; --task generation sends "
                              "prompts")
        from worker.tools.demo_generation import run_generation_demo

        raise typer.Exit(0 if run_generation_demo(cfg, out_dir=out, timeout_s=timeout).ok
                         else 1)
    if task != "moderation":
        raise ConfigError(f"--task {task!r}: the demo runs moderation or generation")
    if out is not None:
        raise ConfigError("--out is for --task generation")
    from worker.tools.demo import run_demo

    ok = run_demo(cfg, images=images, timeout_s=timeout)
    raise typer.Exit(0 if ok else 1)


def _register_subcommands() -> None:
    from worker.tools.engines_cli import engines_app

    app.add_typer(engines_app, name="engines")


_register_subcommands()


def _register_replay() -> None:
    from worker.tools.replay.cli import replay  # its options and logic live there

    app.command(name="replay")(replay)


_register_replay()


def _register_admin() -> None:
    from worker.tools.admin.cli import dlq_app, lag, topics_app  # options and logic live there

    app.add_typer(topics_app, name="topics")
    app.command(name="lag")(lag)
    app.add_typer(dlq_app, name="dlq")


_register_admin()


def main() -> None:
    # A native crash (a segfault in a GPU library, torch's package loader, librdkafka) prints
    # every thread's Python stack to stderr before the process dies, so the log says where:
    # on the H200 torch's AOTInductor loader died silently until this was on.
    with contextlib.suppress(ValueError, OSError):  # a stderr without a file descriptor
        faulthandler.enable(all_threads=True)
    try:
        app()
    except WorkerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
