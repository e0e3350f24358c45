"""LocalSdWeights.load: a folder saved by transformers and diffusers (save_pretrained) loads
into the in-house modules and answers like the references; the files' other names and forms
(.bin, sharded, transformers 4.x naming); errors; and no diffusers or transformers imported."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
pytest.importorskip("diffusers", reason="the references need the dev extra")
pytest.importorskip("safetensors", reason="safetensors is not installed (the gen extra)")
pytest.importorskip("transformers", reason="the references need the dev extra")

import torch
from safetensors.torch import save_file

from engines.exceptions import EngineError, ModelNotFound
from engines.models.sd.nets import VaeDecoderNet
from engines.models.sd.weights import LocalSdWeights
from tests.unit.engines.models.sd.modules.sd_references import assert_close

ROOT = Path(__file__).resolve().parents[6]


def _feeds(seed: int = 0) -> dict[str, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 998, (2, 77), generator=g)
    ids[:, 0], ids[0, 9:], ids[1, 30:] = 998, 999, 999  # bos, words, eos + padding
    return {"text_encoder": (ids,),
            "unet": (torch.randn(2, 4, 8, 16, generator=g), torch.tensor([999.0, 1.0]),
                     torch.randn(2, 77, 32, generator=g)),
            "vae": (torch.randn(2, 4, 8, 8, generator=g) * 4,)}


def _reference_outputs(refs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """What the old nets.py wrappers returned around these references."""
    f = _feeds()
    with torch.no_grad():
        vae = refs["vae"]
        return {
            "text_encoder": refs["text_encoder"](input_ids=f["text_encoder"][0])
            .last_hidden_state.float(),
            "unet": refs["unet"](f["unet"][0], f["unet"][1], encoder_hidden_states=f["unet"][2],
                                 return_dict=False)[0].float(),
            # The wrapper's own arithmetic (unscale, decode, to uint8 NHWC) around diffusers'.
            "vae": VaeDecoderNet(vae, vae.config.scaling_factor)(*f["vae"]),
        }


def _check_loads(folder: Path, refs: dict[str, Any], components: tuple[str, ...] = (
        "text_encoder", "unet", "vae")) -> None:
    weights, want, feeds = LocalSdWeights(folder), _reference_outputs(refs), _feeds()
    for component in components:
        net = weights.load(component)
        assert all(p.dtype == torch.float32 for p in net.parameters())
        with torch.no_grad():
            got = net(*feeds[component])
        if component == "vae":  # uint8 pixels from identical floats: identical
            assert torch.equal(got, want["vae"])
        else:
            assert_close(got, want[component], component)


def test_saved_references_load_and_answer_alike(tiny_folder: Path,
                                                tiny_refs: dict[str, Any]) -> None:
    assert (tiny_folder / "text_encoder" / "model.safetensors").is_file()
    assert (tiny_folder / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    _check_loads(tiny_folder, tiny_refs)


def test_bin_files_and_the_transformers_4_naming(tiny_folder: Path, tiny_refs: dict[str, Any],
                                                 tmp_path: Path) -> None:
    """pytorch_model.bin with ``text_model.`` names and a saved position-ids buffer (SD 1.5's
    published text encoder, transformers 4.x); diffusion_pytorch_model.bin for the UNet."""
    folder = tmp_path / "sd"
    shutil.copytree(tiny_folder, folder)
    state = {"text_model." + k: v for k, v in tiny_refs["text_encoder"].state_dict().items()}
    state["text_model.embeddings.position_ids"] = torch.arange(77)[None]
    (folder / "text_encoder" / "model.safetensors").unlink()
    torch.save(state, folder / "text_encoder" / "pytorch_model.bin")
    (folder / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    torch.save(tiny_refs["unet"].state_dict(), folder / "unet" / "diffusion_pytorch_model.bin")
    _check_loads(folder, tiny_refs, ("text_encoder", "unet"))


def test_sharded_and_variant_files(tiny_folder: Path, tiny_refs: dict[str, Any],
                                   tmp_path: Path) -> None:
    folder = tmp_path / "sd"
    shutil.copytree(tiny_folder, folder)
    unet = folder / "unet"
    (unet / "diffusion_pytorch_model.safetensors").unlink()
    state = tiny_refs["unet"].state_dict()
    names = sorted(state)
    halves = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2:]}
    for file, keys in halves.items():
        save_file({k: state[k].contiguous() for k in keys}, unet / file)
    (unet / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, keys in halves.items() for k in keys}}))
    vae = folder / "vae"
    (vae / "diffusion_pytorch_model.safetensors").unlink()
    half = {k: v.half() for k, v in tiny_refs["vae"].state_dict().items()}
    save_file(half, vae / "diffusion_pytorch_model.fp16.safetensors")
    weights = LocalSdWeights(folder)
    assert weights.checkpoint_files("unet") == [unet / "a.safetensors", unet / "b.safetensors"]
    _check_loads(folder, tiny_refs, ("unet",))
    # The only file there is, an fp16 variant: widened to float32 on load.
    loaded = weights.load("vae").state_dict()
    assert all(v.dtype == torch.float32 and torch.equal(v, half[k].float())
               for k, v in loaded.items())


def test_ambiguous_weight_files_are_model_not_found(tiny_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "sd"
    shutil.copytree(tiny_folder, folder)
    vae = folder / "vae"
    (vae / "diffusion_pytorch_model.safetensors").rename(vae / "x.fp16.safetensors")
    shutil.copy(vae / "x.fp16.safetensors", vae / "x.non_ema.safetensors")
    with pytest.raises(ModelNotFound, match="cannot tell which weights"):
        LocalSdWeights(folder).load("vae")


@pytest.mark.parametrize(("component", "change", "match"), [
    ("unet", {"block_out_channels": [32, 32]}, "do not fit"),
    ("unet", {"down_block_types": ["AttnDownBlock2D", "DownBlock2D"]}, "down_block_types"),
    ("text_encoder", {"num_hidden_layers": 1}, "do not fit"),
    ("vae", {"shift_factor": 0.1}, "shift_factor"),
])
def test_config_and_weights_that_disagree_are_engine_errors(
        tiny_folder: Path, tmp_path: Path, component: str, change: dict[str, Any],
        match: str) -> None:
    folder = tmp_path / "sd"
    shutil.copytree(tiny_folder, folder)
    config = folder / component / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **change}))
    with pytest.raises(EngineError, match=match) as caught:
        LocalSdWeights(folder).load(component)
    assert isinstance(caught.value.__cause__, (RuntimeError, ValueError))


def test_a_corrupt_file_is_an_engine_error(tiny_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "sd"
    shutil.copytree(tiny_folder, folder)
    (folder / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(EngineError, match="could not be read"):
        LocalSdWeights(folder).load("unet")


LOAD_ALL = """
import json, sys
from pathlib import Path
import torch
from engines.models.sd.arch import TINY
from engines.models.sd.nets import skeleton
from engines.models.sd.weights import LocalSdWeights, RandomSdWeights
local, rnd = LocalSdWeights(Path(sys.argv[1])), RandomSdWeights(TINY)
for c in ("text_encoder", "unet", "vae"):
    skeleton(c, rnd.config(c), initialised=False)
    rnd.load(c)
    local.load(c)
with torch.no_grad():
    local.load("vae")(torch.zeros(1, 4, 8, 8))
print(json.dumps(sorted(m for m in ("diffusers", "transformers") if m in sys.modules)))
"""


def test_building_and_loading_imports_neither_diffusers_nor_transformers(
        tiny_folder: Path) -> None:
    done = subprocess.run([sys.executable, "-c", LOAD_ALL, str(tiny_folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
