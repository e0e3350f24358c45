"""`trt-worker engines build|list|verify|prune`: the engine cache from the command line."""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from engines.assembly import EnginePlan
from engines.backends.registry import backend
from engines.cache import CacheEntry, EngineCache, EngineFromCache, check_entry
from engines.device import DeviceFingerprint, current_fingerprint
from engines.exceptions import EngineError
from worker.config import ProcessingSettings, WorkerConfig, load_config
from worker.exceptions import ConfigError
from worker.tasks.registry import TASKS, engine_plans, task_entry
from worker.tools.options import ConfigOpt

engines_app = typer.Typer(no_args_is_help=True,
                          help="Build, list, verify and prune cached engines.")
console = Console()


def _cfg(config: Path | None, backend: str | None, precision: str | None,
         task: str | None) -> WorkerConfig:
    overrides: dict[str, Any] = {"processing": {"task": task}} if task else {}
    section: dict[str, str] = {}
    if backend:
        section["backend"] = backend
    if precision:
        section["precision"] = precision
    if not section:
        return load_config(config, **overrides)
    # The options go to the engine section of the task the build is for (its registry entry's):
    # the config's own task unless --task says (read first without them; a config that is only
    # valid with them is taken as the default task's, the options' original meaning).
    name = task
    if name is None:
        name = ProcessingSettings.model_fields["task"].default
        with contextlib.suppress(ConfigError):
            name = load_config(config).processing.task
    if name not in TASKS:  # --task names no task: the config says so
        return load_config(config, **overrides)
    return load_config(config, **overrides, **{task_entry(name).engine_section: section})


@engines_app.command()
def build(
    config: ConfigOpt = None,
    backend: Annotated[str | None, typer.Option(
        help="A backend name (engines.backends.registry), for the task's engine section.")]
        = None,
    precision: Annotated[str | None, typer.Option(help="fp32 | fp16 | int8 | fp8")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if cached.")] = False,
    task: Annotated[str | None, typer.Option(
        help="A task name (worker.tasks.registry; default: the config's processing.task)")]
        = None,
    net: Annotated[list[str] | None, typer.Option(
        "--net", "--engine",
        help="Build just this engine (repeatable; names as the build prints them), e.g. "
             "after changing only the UNet's batch sizes")] = None,
) -> None:
    """Build (or find) every engine the configured worker would load: each engine of the task's
    registry entry (moderation: every model the served policies run, through its package's
    entry; generation: its text encoder, UNet and VAE decoder). A deploy-time step: the
    worker's start then finds them cached."""
    cfg = _cfg(config, backend, precision, task)
    plans = engine_plans(cfg)
    unknown = sorted(set(net or ()) - set(plans))
    if unknown:
        raise typer.BadParameter(f"no engine {', '.join(unknown)} (the {cfg.processing.task} "
                                 f"task has {', '.join(plans)})", param_hint="--net")
    for name, plan in plans.items():
        if not net or name in net:
            _build(plan, plan.loader(), force)


def _build(plan: EnginePlan, loader: EngineFromCache, force: bool) -> None:
    cache, recipe = loader.cache, loader.recipe
    existing = None if force else cache.lookup(recipe)
    if existing is not None:
        console.print(f"cached: {existing.path} ({existing.sidecar['build_seconds']} s to build)")
        return
    profiles = ", ".join(p.name for p in plan.profiles)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        what = (f"building {plan.spec.model_id} ({plan.backend} {plan.precision}, profiles "
                f"{profiles}) for {recipe.device.describe()}")
        hint = backend(plan.backend).build_hint
        if hint is not None:  # say why nothing seems to happen for a while
            what += f" - {hint}"
        progress.add_task(escape(what), total=None)
        started = time.monotonic()
        with cache.lock(recipe):
            entry = cache.save(recipe, loader.build)
    console.print(f"built {entry.path} in {time.monotonic() - started:.1f} s "
                  f"({entry.sidecar['artifact']['bytes'] / 1e6:.1f} MB)")
    for name, shape in entry.sidecar.get("build", {}).get("shapes", {}).items():
        timings = ", ".join(f"{v} {ms} ms" for v, ms in shape["ms"].items() if ms is not None)
        console.print(f"  {name}: serving {shape['serve']} ({timings}); compiled in "
                      f"{shape['compile_seconds']} s, max error {shape['max_error']:.1e}")


def _cache(cache_dir: str | None) -> EngineCache:
    return EngineCache(Path(cache_dir) if cache_dir else load_config().engines.cache_dir)


def _device_for(entry: CacheEntry, seen: dict[str, DeviceFingerprint | None]
                ) -> DeviceFingerprint | None:
    kind = str(entry.sidecar["device"]["kind"])
    if kind not in seen:
        try:
            seen[kind] = current_fingerprint(kind)
        except EngineError:
            seen[kind] = None  # e.g. no CUDA on this machine
    return seen[kind]


@engines_app.command("list")
def list_(cache_dir: Annotated[str | None, typer.Option(help="Cache folder.")] = None) -> None:
    """List cached engines and whether they fit this machine."""
    cache = _cache(cache_dir)
    table = Table(title=f"engines in {cache.root}")
    for col in ("key", "model", "backend", "precision", "profiles", "device", "MB", "built",
                "fits here"):
        table.add_column(col)
    seen: dict[str, DeviceFingerprint | None] = {}
    for e in cache.entries():
        sc = e.sidecar
        dev = DeviceFingerprint.from_dict(sc["device"])
        here = _device_for(e, seen)
        table.add_row(e.key[:12], sc["model_id"], f"{sc['backend']} {sc['backend_version']}",
                      sc["precision"], ",".join(p["name"] for p in sc["profiles"]), dev.name,
                      f"{sc['artifact']['bytes'] / 1e6:.1f}", sc["built_at"],
                      "yes" if here == dev else ("unknown" if here is None else "no"))
    console.print(table)


@engines_app.command()
def verify(cache_dir: Annotated[str | None, typer.Option(help="Cache folder.")] = None) -> None:
    """Re-hash every artifact against its sidecar and check it fits this machine; stamp the
    entries that hash right, so that workers need not hash them again at start."""
    cache = _cache(cache_dir)
    seen: dict[str, DeviceFingerprint | None] = {}
    bad = 0
    for e in cache.entries():
        here = _device_for(e, seen)
        try:
            if here is None:
                raise EngineError(f"no {e.sidecar['device']['kind']} device on this machine")
            check_entry(e, here, None, verify_bytes=True, write_stamp=True)
            console.print(f"ok       {e.key[:12]} {e.sidecar['backend']} {e.sidecar['precision']}")
        except EngineError as exc:
            bad += 1
            console.print(f"[red]problem[/] {e.key[:12]}: {exc}")
    raise typer.Exit(1 if bad else 0)


@engines_app.command()
def prune(
    cache_dir: Annotated[str | None, typer.Option(help="Cache folder.")] = None,
    older_than_days: Annotated[float | None, typer.Option(help="Also remove older ones.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Remove every entry.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Only say what would go.")] = False,
) -> None:
    """Remove entries that cannot load here (other device), or older ones, or all."""
    cache = _cache(cache_dir)
    seen: dict[str, DeviceFingerprint | None] = {}
    cutoff = (datetime.now(UTC) - timedelta(days=older_than_days)
              if older_than_days is not None else None)
    removed = 0
    for e in cache.entries():
        here = _device_for(e, seen)
        foreign = here is not None and DeviceFingerprint.from_dict(e.sidecar["device"]) != here
        old = cutoff is not None and datetime.fromisoformat(e.sidecar["built_at"]) < cutoff
        if all_ or foreign or old:
            why = "all" if all_ else ("other device" if foreign else "old")
            console.print(f"{'would remove' if dry_run else 'removing'} {e.key[:12]} ({why})")
            if not dry_run:
                cache.remove(e)
            removed += 1
    console.print(f"{removed} entr{'y' if removed == 1 else 'ies'} "
                  f"{'to remove' if dry_run else 'removed'}")
