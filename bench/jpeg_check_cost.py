"""What the GPU path's per-image JPEG check costs on this machine's CPU, per checkout.

The moderation GPU task calls ``jpeg_plain`` once per image on its loop's thread, so its cost
comes straight off one process's frames/s. This times it over the kafka_e2e bench's photos for
this checkout and for others given with ``--code-root`` (e.g. the commit before a change),
each in its own process so each imports its own ``worker``:

    python bench/jpeg_check_cost.py --out DIR [--code-root .before ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from bench.common import environment, write  # noqa: E402


def child(root: Path, n: int, rounds: int) -> dict[str, Any]:
    """In a process whose ``worker`` is ``root``'s: microseconds per image, per round."""
    from bench.corpus import jpeg_photos  # this checkout's corpus: the same photos for all

    photos = jpeg_photos(n, seed=0)
    for name in [m for m in sys.modules if m == "worker" or m.startswith("worker.")]:
        del sys.modules[name]  # the corpus imported this checkout's; time root's
    sys.path.insert(0, str(root))
    from worker.tasks.moderation.images.cpu import jpeg_plain

    per_round = []
    plain = 0
    for _ in range(rounds):
        t = time.perf_counter()
        plain = sum(map(jpeg_plain, photos))
        per_round.append((time.perf_counter() - t) / n * 1e6)
    return {"us_per_image": per_round, "median_us": statistics.median(per_round),
            "plain": plain, "images": n,
            "module": sys.modules[jpeg_plain.__module__].__file__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--code-root", type=Path, action="append", default=[])
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.images, args.rounds)))
        return
    rows = {}
    for root in [HERE, *args.code_root]:
        commit = (root / "COMMIT").read_text().strip() if (root / "COMMIT").is_file() else "this"
        p = subprocess.run([sys.executable, __file__, "--child", str(root.resolve()),
                            "--images", str(args.images), "--rounds", str(args.rounds)],
                           capture_output=True, text=True, check=True)
        rows[f"{root.name or 'here'}@{commit}"] = json.loads(p.stdout.splitlines()[-1])
    for name, row in rows.items():
        print(f"{name}: {row['median_us']:.2f} us per image ({row['plain']} of "
              f"{row['images']} plain)")
    record = {"bench": "jpeg_check_cost", "env": environment(), "checkouts": rows,
              "params": {k: str(v) for k, v in vars(args).items() if k != "child"}}
    print("wrote", write("jpeg-check-cost", record, args.out))


if __name__ == "__main__":
    main()
