"""ClipTokenizer (built on `tokenizers`) against transformers' CLIPTokenizer, on the real CLIP
vocabulary (tests/fixtures/clip, expanded into an SD-style vocab.json + merges.txt here).

The reference is the transformers this project runs (5.x), where CLIPTokenizer is itself
tokenizers-backed: ids must match it on every string of the corpus. transformers 4.x's *slow*
CLIPTokenizer (ftfy not installed, so its BasicTokenizer path) was also run, out of tree
(4.57.3), on this corpus: 126 of its 406 strings differ, all for these four reasons, each
pinned by test_documented_differences_from_the_4x_slow_tokenizer:

1. CJK ideographs: 4.x makes each one a word of its own ("中文" -> 中</w> 文</w>); here a run
   of letters is one word, as in OpenAI's CLIP.
2. Unicode control/format characters (category C*, but tab/newline/CR) and U+FFFD: 4.x deletes
   them; here they are kept (bytes; the \\s ones, e.g. \\x0b, become spaces).
3. Final sigma: 4.x lowercases with Python's str.lower (a word-final capital sigma becomes
   U+03C2); here every capital sigma becomes U+03C3.
4. An uppercase "<|ENDOFTEXT|>": 4.x lowercases it into the end token; here only the exact
   literal is special, other spellings are plain text.
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines.exceptions import ModelNotFound
from engines.models.sd.tokenizer import ClipTokenizer

REPO = Path(__file__).resolve().parents[5]
BPE_GZ = REPO / "tests" / "fixtures" / "clip" / "bpe_simple_vocab_16e6.txt.gz"
BOS, EOS = 49406, 49407

PROMPTS = [
    "a photo of a cat", "An astronaut riding a horse on Mars, digital art, trending on artstation",
    "portrait of a woman, oil painting, by Rembrandt, 8k, highly detailed",
    "a red car parked in front of a house at sunset", "cyberpunk city at night, neon lights, rain",
    "a bowl of fruit on a wooden table, still life", "A DOG WEARING SUNGLASSES",
    "landscape with mountains and a lake, golden hour, 35mm photograph",
    "close-up of a hummingbird, macro lens, f/2.8, bokeh",
    "isometric pixel-art castle; 16-bit; retro game", "watercolor of a fox in the snow",
    "a steampunk robot drinking tea", "the quick brown fox jumps over the lazy dog",
]
EDGE_CASES = [
    "", " ", "\t\n ", "a", "A", "!!!", "...", "?!?!", "hello, world!", "it's", "don't", "we're",
    "they've", "I'm", "you'll", "she'd", "IT'S DON'T WE'RE", "rock'n'roll", "o'clock",
    "''quoted''", '"double quoted"', "`backtick`", "(parens) [brackets] {braces}",
    "1", "42", "2024", "3.14159", "1,000,000", "1st 2nd 3rd 4th", "v1.5", "x=y+z*2/3-1",
    "100%", "$9.99", "#hashtag @mention", "user@example.com", "https://example.com/a?b=c&d=e",
    "a  b   c", "a\tb\nc\r\nd", "  leading and trailing  ", "\n\n\nnewlines\n\n",
    "MiXeD CaSe WoRdS", "ÉLAN", "café crème brûlée", "naïve façade", "Straße", "STRASSE",
    "Ærøskøbing", "ﬁne ﬂow", "e\u0301 vs é", "Å vs A\u030a", "İstanbul", "ΣΊΣΥΦΟΣ", "Ὀδυσσεύς",
    "Москва", "Привет, мир!", "こんにちは世界", "カタカナ", "中文", "我爱北京天安门",
    "한국어 텍스트", "مرحبا بالعالم", "שלום", "हिन्दी", "ไทย", "Tiếng Việt",
    "🙂", "😀😃😄", "a 🐱 cat", "👍🏽", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "❤️", "★☆♥♦", "→ ← ↑ ↓",
    "°C ± µm", "<|endoftext|>", "a <|endoftext|> b", "<|startoftext|>hello<|endoftext|>",
    "x<|endoftext|>y", "<|ENDOFTEXT|>", "<|endoftext|><|endoftext|>", "< | endoftext | >",
    "<|endoftext", "soft\u00adhyphen", "zero\u200bwidth", "non\u00a0breaking space",
    "em\u2003space", "line\u2028sep", "nul\x00char", "bell\x07char", "vt\x0bff\x0c",
    "nel\x85x", "bom\ufeffx", "repl\ufffdx", "tab\t\ttab",
    "word " * 100, "a, " * 60, "supercalifragilisticexpialidocious " * 20,
    "🙂" * 80, "中" * 90, "1234567890" * 10, " ".join(PROMPTS),
]
POOL = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        + list(" \t\n  ") + list(".,;:!?'\"-_()[]{}<>|/\\@#$%^&*+=~`")
        + list("éèêëàâäôöùûüçñßÉÀÇØøåæœ") + list("中文字日本語") + list("αβγΣσДжЯ")
        + ["🙂", "🐱", "❤️", "👍🏽", "'s", "'t", "'re", "<|endoftext|>", "\u200d"])


def corpus() -> list[str]:
    texts = PROMPTS + EDGE_CASES
    for p in PROMPTS:  # case, spacing, punctuation and accent variants of real prompts
        texts += [p.upper(), p.title(), p.replace(" ", "  \t"), p.replace(" ", "\n"),
                  p + "!!!", f"'{p}'s", p.replace("a", "á").replace("o", "ö")]
    rng = random.Random(0)  # fixed: the same 200 mixed-script strings every run
    texts += ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 40))) for _ in range(200)]
    return texts


def byte_chars() -> dict[int, str]:
    """CLIP's (GPT-2's) printable stand-in for each byte value, in CLIP's vocabulary order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(rest)}


def write_clip_folder(folder: Path) -> None:
    """vocab.json + merges.txt as CLIP builds them from its merge list: 49408 tokens."""
    lines = gzip.decompress(BPE_GZ.read_bytes()).decode("utf-8").split("\n")
    merges = lines[1:49152 - 256 - 2 + 1]  # CLIP uses the first 48894 merges
    chars = list(byte_chars().values())
    tokens = [*chars, *(c + "</w>" for c in chars), *("".join(m.split()) for m in merges),
              "<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(
        json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n",
                                       encoding="utf-8")


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clip") / "tokenizer"
    write_clip_folder(folder)
    return folder


@pytest.fixture(scope="module")
def tok(clip_folder: Path) -> ClipTokenizer:
    return ClipTokenizer(clip_folder)


def reference_ids(folder: Path, texts: list[str]) -> np.ndarray:
    transformers = pytest.importorskip("transformers", reason="the reference tokenizer")
    # 4.x: its tokenizers-backed CLIPTokenizerFast is the same pipeline as 5.x's CLIPTokenizer
    # (the slow one differs on exotic input: see the docstring).
    cls = getattr(transformers, "CLIPTokenizerFast", transformers.CLIPTokenizer)
    ref = cls.from_pretrained(str(folder), local_files_only=True)
    enc = ref(texts, padding="max_length", max_length=77, truncation=True, return_tensors="np")
    return np.asarray(enc["input_ids"], dtype=np.int64)


def text_of(tok: ClipTokenizer, folder: Path, text: str) -> tuple[str, list[str]]:
    """What the content tokens of ``text`` spell (bytes decoded), and the tokens themselves."""
    vocab = {i: t for t, i in json.loads((folder / "vocab.json").read_text("utf-8")).items()}
    ids = [int(i) for i in tok([text])[0][1:]]
    tokens = [vocab[i] for i in ids[: ids.index(EOS)]]
    byte_of = {c: b for b, c in byte_chars().items()}
    raw = bytes(byte_of[c] for t in tokens for c in t.removesuffix("</w>"))
    return raw.decode("utf-8"), tokens


def test_the_fixture_is_clips_vocabulary(clip_folder: Path) -> None:
    vocab = json.loads((clip_folder / "vocab.json").read_text("utf-8"))
    assert len(vocab) == 49408 and vocab["<|startoftext|>"] == BOS and vocab["<|endoftext|>"] == EOS
    assert vocab["a</w>"] == 320 and vocab["photo</w>"] == 1125  # ids SD 1.5 prompts use


def test_ids_match_transformers_clip_tokenizer(tok: ClipTokenizer, clip_folder: Path) -> None:
    texts = corpus()
    assert len(texts) == 406
    ours = tok(texts)
    assert ours.shape == (len(texts), 77) and ours.dtype == np.int64 and tok.max_length == 77
    ref = reference_ids(clip_folder, texts)
    bad = [t for t, a, b in zip(texts, ours, ref, strict=True) if not np.array_equal(a, b)]
    assert bad == []


def test_long_prompts_keep_the_end_token(tok: ClipTokenizer) -> None:
    ids = tok(["word " * 100, "a photo of a cat"])
    assert ids[0, 0] == BOS and ids[0, 76] == EOS and (ids[0, 1:76] != EOS).all()
    assert list(ids[1, :7]) == [BOS, 320, 1125, 539, 320, 2368, EOS]
    assert (ids[1, 7:] == EOS).all()  # SD 1.5 pads with the end token
    assert tok([]).shape == (0, 77)


@pytest.mark.parametrize(("config", "pad"), [
    ("tokenizer_config.json", "!"),
    ("tokenizer_config.json", {"__type": "AddedToken", "content": "!", "normalized": False}),
    ("special_tokens_map.json", {"content": "!", "lstrip": False, "normalized": False,
                                 "rstrip": False, "single_word": False}),
])
def test_pad_token_comes_from_the_folder_config(clip_folder: Path, tmp_path: Path,
                                                config: str, pad: object) -> None:
    """SD 2.x pads with "!" (id 0); its tokenizer folder says so."""
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes((clip_folder / name).read_bytes())
    (tmp_path / config).write_text(json.dumps({"pad_token": pad}))
    texts = ["a photo of a cat", "", "word " * 100]
    ids = ClipTokenizer(tmp_path)(texts)
    assert list(ids[0, 6:8]) == [EOS, 0] and (ids[0, 7:] == 0).all()
    np.testing.assert_array_equal(ids, reference_ids(tmp_path, texts))


def test_documented_differences_from_the_4x_slow_tokenizer(tok: ClipTokenizer,
                                                           clip_folder: Path) -> None:
    """The module docstring's four cases, as this tokenizer (and transformers 5) does them."""
    spelled, tokens = text_of(tok, clip_folder, "中文")  # 1. one word, one </w>
    assert spelled == "中文" and [t.endswith("</w>") for t in tokens][-2:] == [False, True]
    for text, want in [("a\u200db", "a\u200db"), ("soft\u00adhyphen", "soft\u00adhyphen"),
                       ("bom\ufeffx", "bom\ufeffx"), ("nul\x00x", "nul\x00x"),
                       ("repl\ufffdx", "repl\ufffdx")]:
        assert text_of(tok, clip_folder, text)[0] == want  # 2. kept
    np.testing.assert_array_equal(tok(["vt\x0bff"]), tok(["vt ff"]))  # \x0b is \s: a space
    assert text_of(tok, clip_folder, "ΟΔΟΣ")[0] == "οδοσ"  # 3. no final sigma
    upper = tok(["<|ENDOFTEXT|>", "<|endoftext|>"])  # 4. only the exact literal is special
    assert text_of(tok, clip_folder, "<|ENDOFTEXT|>")[0] == "<|endoftext|>"
    assert (upper[0, 1:] != EOS).sum() > 1 and list(upper[1, :3]) == [BOS, EOS, EOS]


@pytest.mark.parametrize("missing", ["vocab.json", "merges.txt"])
def test_missing_vocabulary_file_is_model_not_found(clip_folder: Path, tmp_path: Path,
                                                    missing: str) -> None:
    for name in {"vocab.json", "merges.txt"} - {missing}:
        (tmp_path / name).write_bytes((clip_folder / name).read_bytes())
    with pytest.raises(ModelNotFound, match=r"vocab\.json \+ merges\.txt"):
        ClipTokenizer(tmp_path)


def test_without_tokenizers_is_model_not_found(clip_folder: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(ModelNotFound, match=r"pip install 'kafka-trt-worker\[gen\]'"):
        ClipTokenizer(clip_folder)


def test_tokenizing_does_not_import_transformers(clip_folder: Path) -> None:
    code = ("import sys\nfrom pathlib import Path\n"
            "from engines.models.sd.tokenizer import ClipTokenizer\n"
            f"ids = ClipTokenizer(Path({str(clip_folder)!r}))(['a photo of a cat'])\n"
            "print(ids[0, :3].tolist(), 'transformers' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120, cwd=REPO).stdout.split("\n")
    assert out[0] == f"[{BOS}, 320, 1125] False"
