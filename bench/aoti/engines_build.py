"""Compile times and per-shape timings of the compiled engines, as a deploy step builds them:
``trt-worker engines build`` run as a user runs it, then every sidecar it wrote gathered into
one record (per shape: compile seconds, error against the float32 network, the milliseconds of
the package, a CUDA graph over it and the eager network under a graph, and what is served).

    python bench/aoti/engines_build.py --out DIR --cache DIR [--task generation]
        [--backend aoti] [--net unet] [--force]
        [--config-json '{"generation": {...}, "engines": {...}}']

``--config-json``: config sections as the worker's ``KTW_<SECTION>`` environment overrides take
them (e.g. the generation batch sizes, ``engines.autotune``). Nothing here talks to Kafka.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from bench.common import environment, write  # noqa: E402


def sidecars(cache: Path) -> list[dict[str, Any]]:
    """What each cache entry under ``cache`` records about its build."""
    from engines.cache import EngineCache

    return [{"key": e.key, "model": e.sidecar["model_id"], "backend": e.sidecar["backend"],
             "precision": e.sidecar["precision"], "bytes": e.sidecar["artifact"]["bytes"],
             "build_seconds": e.sidecar["build_seconds"], "build": e.sidecar.get("build")}
            for e in EngineCache(cache).entries()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--task", default="generation")
    ap.add_argument("--backend", default="aoti")
    ap.add_argument("--config-json", default="{}")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--net", action="append", default=[],
                    help="generation: build just this net (repeatable)")
    args = ap.parse_args()
    sections: dict[str, Any] = json.loads(args.config_json)
    sections.setdefault("engines", {})["cache_dir"] = str(args.cache)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env |= {f"KTW_{k.upper()}": json.dumps(v) for k, v in sections.items()}
    cmd = [sys.executable, "-m", "worker", "engines", "build", "--task", args.task,
           "--backend", args.backend, *(["--force"] if args.force else []),
           *(x for n in args.net for x in ("--net", n))]
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=HERE, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    log_tail = (proc.stdout + proc.stderr)[-4000:]
    print(log_tail)
    record: dict[str, Any] = {"bench": "engines_build", "env": environment(), "command": cmd[1:],
              "sections": sections, "exit_code": proc.returncode, "wall_s": round(wall, 1),
              "entries": sidecars(args.cache), "log_tail": log_tail}
    path = write(f"engines-build-{args.task}-{args.backend}", record, args.out)
    print(f"engines_build: exit {proc.returncode} in {wall:.0f} s -> {path}")
    for e in record["entries"]:
        for shape, s in ((e.get("build") or {}).get("shapes") or {}).items():
            print(f"  {e['model']} {shape}: compile {s.get('compile_seconds')} s, "
                  f"error {s.get('max_error')}, ms {s.get('ms')}, serve {s.get('serve')}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
