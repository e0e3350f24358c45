"""The in-house CLIP text encoder against transformers' CLIPTextModel (TINY, float32, CPU)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
pytest.importorskip("diffusers", reason="the references need the dev extra")
pytest.importorskip("transformers", reason="the references need the dev extra")

import torch

from engines.models.sd.arch import TINY
from engines.models.sd.modules import ClipTextModel
from engines.models.sd.modules.text import text_state
from tests.unit.engines.models.sd.modules.sd_references import (
    assert_close,
    inhouse,
    shapes,
    to_inhouse,
)

BOS, EOS = TINY.text["bos_token_id"], TINY.text["eos_token_id"]


def _padded(lengths: list[int], width: int = 77) -> torch.Tensor:
    """bos, random words, eos, then eos as padding (CLIP's padding token), like the tokenizer."""
    g = torch.Generator().manual_seed(7)
    ids = torch.full((len(lengths), width), EOS, dtype=torch.int64)
    for row, n in enumerate(lengths):
        ids[row, 0] = BOS
        ids[row, 1:n + 1] = torch.randint(0, BOS, (n,), generator=g)
    return ids


@pytest.mark.parametrize("ids", [_padded([3, 60]), _padded([0]), _padded([5, 12], width=16)],
                         ids=["two-padded-rows", "empty-prompt", "16-tokens"])
def test_matches_transformers(tiny_refs: dict[str, Any], ids: torch.Tensor) -> None:
    ref = tiny_refs["text_encoder"]
    net = inhouse("text_encoder", TINY.text)
    net.load_state_dict(to_inhouse("text_encoder", ref.state_dict()), strict=True)
    with torch.no_grad():
        want = ref(input_ids=ids).last_hidden_state
        got = net(ids)
    assert_close(got, want, "text_encoder")


def test_same_entries_as_the_reference(tiny_refs: dict[str, Any]) -> None:
    """Equal to transformers' up to its 5.x naming (no ``text_model.``), which text_state maps
    onto the published checkpoints' names; no position-ids buffer on either side of a load."""
    ref_state = text_state(tiny_refs["text_encoder"].state_dict())
    assert shapes(ClipTextModel(TINY.text).state_dict()) == shapes(ref_state)
    assert list(ClipTextModel(TINY.text).buffers()) == []


def test_text_state_takes_either_naming_and_drops_position_ids() -> None:
    w = torch.zeros(2)
    old = {"text_model.final_layer_norm.weight": w,
           "text_model.embeddings.position_ids": torch.arange(77)[None]}
    new = {"final_layer_norm.weight": w, "embeddings.position_ids": torch.arange(77)[None]}
    assert text_state(old).keys() == text_state(new).keys() == {
        "text_model.final_layer_norm.weight"}


@pytest.mark.parametrize(("change", "key"), [
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"model_type": "bert"}, "model_type"),
    ({"architectures": ["CLIPTextModelWithProjection"]}, "architectures"),
    ({"num_attention_heads": 5}, "num_attention_heads"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
])
def test_unsupported_config_names_the_key(change: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=f"CLIPTextModel config: {key}="):
        ClipTextModel({**TINY.text, **change})


def test_generic_transformers_keys_are_ignored() -> None:
    """transformers' configs carry generation and output switches no layer reads."""
    net = ClipTextModel({**TINY.text, "output_hidden_states": True, "id2label": {"0": "a"},
                         "torch_dtype": "float16", "transformers_version": "4.22.0"})
    assert shapes(net.state_dict()) == shapes(ClipTextModel(TINY.text).state_dict())


def test_random_init_follows_transformers(tiny_refs: dict[str, Any]) -> None:
    """Same standard deviations as CLIPPreTrainedModel._init_weights (embeddings 0.02, not
    torch's 1), so random-weight engines see realistic value ranges."""
    torch.manual_seed(0)
    net = ClipTextModel(TINY.text).state_dict()
    ref = text_state(tiny_refs["text_encoder"].state_dict())
    for name in ("text_model.embeddings.token_embedding.weight",
                 "text_model.encoder.layers.0.self_attn.q_proj.weight",
                 "text_model.encoder.layers.1.mlp.fc1.weight"):
        assert float(net[name].std()) == pytest.approx(float(ref[name].std()), rel=0.2), name
    assert not net["text_model.encoder.layers.0.mlp.fc2.bias"].any()
