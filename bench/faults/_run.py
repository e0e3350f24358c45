"""Shared plumbing of the fault scripts: a broker, a log folder, the JSON record."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import environment, write
from worker.devkit.local_kafka import LocalKafka

# The code a run measures is the tree as the run starts: a long run's record must not name a
# commit made while it ran.
AT_START = environment()


@contextlib.contextmanager
def broker(*, local_only: bool = False) -> Iterator[tuple[str, LocalKafka | None]]:
    """$KAFKA_BOOTSTRAP_SERVERS if set (unless ``local_only``), else a fresh LocalKafka."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if external and not local_only:
        yield external, None
        return
    with LocalKafka() as kafka:
        yield kafka.bootstrap_servers, kafka


def log_dir(name: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f"ktw-{name}-"))
    print(f"worker logs: {path}", file=sys.stderr)
    return path


def modes(arg: str) -> list[str]:
    out = [m.strip() for m in arg.split(",") if m.strip()]
    bad = set(out) - {"at-least-once", "exactly-once"}
    if bad:
        raise SystemExit(f"unknown mode(s): {sorted(bad)}")
    return out


def add_modes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default="at-least-once,exactly-once",
                   help="comma-separated guarantees to run")
    p.add_argument("--model", choices=("tiny", "open_nsfw"), default="tiny",
                   help="what the workers run: the tiny test classifier as an installed "
                        "plug-in (keeps up with thousands of jobs/s on 2 CPU cores, so the "
                        "run measures the delivery path) or open_nsfw (tens of jobs/s on CPU)")


# The tiny classifier's policy, as every job's ("default"), and batch profiles that fit the
# drills' batch sizes.
_TINY_POLICY = {"default": {"models": ["tiny"],
                            "labels": {"bright": {"review": 0.3, "block": 0.6}}}}


@functools.cache
def _tiny_plugin() -> Path:
    """The tiny classifier's distribution folder, written once per run."""
    from tests.harness.plugins import TINY, write_plugin_dist

    return write_plugin_dist(Path(tempfile.mkdtemp(prefix="ktw-plugin-")), TINY)


def model_env(model: str) -> dict[str, str]:
    """Environment for the fleet's workers to run ``model`` on every job."""
    if model == "open_nsfw":
        return {}
    repo = Path(__file__).resolve().parents[2]
    path = [str(_tiny_plugin()), str(repo), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path),
            "KTW_MODERATION__POLICIES": json.dumps(_TINY_POLICY),
            "KTW_MODERATION__TINY__BATCH_SIZES": "[1, 8, 16, 32]"}


def audit_ok(f: dict[str, Any], mode: str) -> bool:
    """Every output names its job; exactly-once keeps offset order per partition."""
    return not f["content_faults"] and (mode != "exactly-once" or f["order_inversions"] == 0)


def finish(name: str, params: dict[str, Any], runs: list[dict[str, Any]], started: float,
           ok: bool) -> Path:
    env = environment()  # (commit, dirty flag, versions: bench.common.provenance)
    if (env.get("commit"), env.get("dirty")) != (AT_START.get("commit"), AT_START.get("dirty")):
        env = {**env, "commit": AT_START.get("commit"), "dirty": AT_START.get("dirty"),
               "commit_at_end": env.get("commit"), "dirty_at_end": env.get("dirty")}
    record = {"bench": name, "env": env, "params": params, "runs": runs,
              "wall_s": round(time.monotonic() - started, 1), "ok": ok}
    path = write(name, record)
    print(json.dumps(runs, indent=1, sort_keys=True))
    print(f"{'PASS' if ok else 'FAIL'}: record written to {path}")
    return path
