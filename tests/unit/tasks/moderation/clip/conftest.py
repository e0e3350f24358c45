"""A tiny random CLIP checkpoint in the Hugging Face layout, made by transformers itself.

The folder holds what a real one does (config.json, model.safetensors, tokenizer.json), so the
loading code is the production path; transformers' CLIPModel is the reference it is checked
against. Tests skip, saying why, where transformers or tokenizers is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

WORDS = [
    "a", "photo", "of", "cat", "dog", "knife", "gun", "blood", "beach", "sunset", "car", "tree",
    "house", "person", "people", "violence", "weapon", "drugs", "money", "scam", "fight",
    "everyday", "ordinary", "objects", "scenery", "red", "blue", "green", "big", "small", "happy",
    "sad", "street", "night", "day", "food", "water", "sky",
]
BOS, EOS, UNK = 97, 98, 96
IMAGE_SIZE = 64


def _tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    vocab = {"<pad>": 0, **{w: i + 1 for i, w in enumerate(WORDS)}, "<unk>": UNK,
             "<|startoftext|>": BOS, "<|endoftext|>": EOS}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", BOS), ("<|endoftext|>", EOS)])
    tok.save(str(path))


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch", reason="CLIP towers are torch modules")
    transformers = pytest.importorskip("transformers",
                                       reason="the tiny checkpoint is made by transformers")
    pytest.importorskip("tokenizers", reason="CLIP tokenisation uses tokenizers")
    torch.manual_seed(7)
    cfg = transformers.CLIPConfig(
        text_config={"vocab_size": 99, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4,
                     "max_position_embeddings": 77, "bos_token_id": BOS, "eos_token_id": EOS,
                     "pad_token_id": 0},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": IMAGE_SIZE, "patch_size": 16},
        projection_dim=16)
    model = transformers.CLIPModel(cfg).eval()
    with torch.no_grad():
        model.logit_scale.fill_(4.0)  # "trained": differs from the config's initial 2.6592
    folder = tmp_path_factory.mktemp("tiny-clip")
    model.save_pretrained(folder)
    _tokenizer(folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="session")
def reference(tiny_clip: Path) -> Any:
    import transformers

    return transformers.CLIPModel.from_pretrained(tiny_clip).eval()
