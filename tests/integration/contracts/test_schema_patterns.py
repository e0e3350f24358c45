"""Every ``pattern`` in schemas/ means the same to an ECMA-262 engine and to RE2.

JSON Schema patterns are ECMA-262, but validators use their language's engine: ajv (Node)
compiles them with the ``u`` flag, Go's validators with Go's ``regexp`` (RE2 syntax), where
``\\s`` is ASCII whitespace only: ``\\S`` let a text of no-break spaces through there. Each
pattern is compiled by Node (``regex_check.js``) and by Go (``regex_check.go``, ``go run``) and
run on the same samples (every character class boundary the patterns have, each Unicode space,
the examples' strings); both must compile every pattern and agree on every sample. The worker's
own "not blank" check (Python ``re``) must agree with ECMA-262 on the samples too. No broker
needed; skipped without node or go.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.contract import SCHEMAS
from worker.wire import generation_codec, moderation_codec

HERE = Path(__file__).parent
# Characters where engines' ideas of whitespace, word and case differ: every ECMA-262
# WhiteSpace and LineTerminator, what Python's isspace() adds (U+001C-U+001F, U+0085), the
# former space U+180E, zero-width ones, a non-BMP character, and all of ASCII.
SPECIAL = [0x85, 0xA0, 0x1680, 0x180E, *range(0x2000, 0x200C), 0x2028, 0x2029, 0x202F, 0x205F,
           0x2060, 0x3000, 0xFEFF, 0xFFFD, 0x1F600, 0x130, 0x131, 0x17F, 0x212A]
FIXED = ["", "default", "default\n", "Default", "a" * 64, "a" * 65, "v2.strict_mode-1", "-x",
         "open_nsfw.nsfw", "text.violence", "clip.consistency", "open_nsfw.", "nsfw.nsfw",
         "block:text.violence", "review:clip.consistency", "block:", "review:", "allow",
         "none", "allow\n", "iVBORw0KGgo", "iVBORw0KGgs", "iVBORw0KGgt", "0" * 64, "f" * 64,
         "F" * 64, "0" * 63, "0" * 65, "a cat\u00a0", "\u00a0\u3000\ufeff", " \t\n\r\f\v"]


def _patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            elif key == "patternProperties" and isinstance(value, dict):
                yield from value
            yield from _patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from _patterns(item)


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield key
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def all_patterns() -> list[str]:
    found = {p for path in sorted(SCHEMAS.glob("*.schema.json"))
             for p in _patterns(json.loads(path.read_text()))}
    return sorted(found)


def samples() -> list[str]:
    chars = [chr(c) for c in (*range(0x80), *SPECIAL)]
    out = [*FIXED, *chars, *(c * 3 for c in chars), *(f"x{c}" for c in chars),
           *(f"{c}x" for c in chars)]
    for path in sorted((SCHEMAS / "examples").glob("*.json")):
        out += [s for s in _strings(json.loads(path.read_text())) if len(s) <= 200]
    return list(dict.fromkeys(out))


def _run(tool: list[str], spec: Path) -> dict[str, Any]:
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": ""}
    run = subprocess.run([*tool, str(spec)], capture_output=True, text=True, timeout=300,
                         cwd=HERE, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out: dict[str, Any] = json.loads(run.stdout)
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    missing = [tool for tool in ("node", "go") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)}: the patterns are run in Node and in Go")
    spec = tmp_path_factory.mktemp("patterns") / "spec.json"
    spec.write_text(json.dumps({"patterns": all_patterns(), "samples": samples()}))
    return {"ecma": _run(["node", "regex_check.js"], spec),
            "re2": _run(["go", "run", "regex_check.go"], spec)}


def test_the_schemas_have_the_patterns_this_test_is_about() -> None:
    patterns = all_patterns()
    assert moderation_codec.TEXT_PRESENT.pattern in patterns
    assert generation_codec.PROMPT_PRESENT.pattern in patterns
    assert moderation_codec.POLICY_NAME.pattern in patterns
    assert len(patterns) >= 6


@pytest.mark.parametrize("pattern", all_patterns())
def test_a_pattern_compiles_and_matches_alike_in_ecma_262_and_re2(
        reports: dict[str, dict[str, Any]], pattern: str) -> None:
    ecma, re2 = reports["ecma"], reports["re2"]
    assert ecma["compiled"][pattern] is None, ecma["compiled"][pattern]
    assert re2["compiled"][pattern] is None, re2["compiled"][pattern]
    texts = samples()
    differ = [(texts[i], e, r) for i, (e, r) in
              enumerate(zip(ecma["matches"][pattern], re2["matches"][pattern], strict=True))
              if e != r]
    assert not differ, f"{len(differ)} samples differ (sample, ECMA-262, RE2): {differ[:8]}"


def test_the_worker_reads_blank_as_ecma_262_does(reports: dict[str, dict[str, Any]]) -> None:
    """The codecs' own check (Python ``re``) decides as the schema's pattern in ECMA-262."""
    texts = samples()
    ecma = reports["ecma"]["matches"][moderation_codec.TEXT_PRESENT.pattern]
    assert [bool(moderation_codec.TEXT_PRESENT.search(t)) for t in texts] == ecma
    assert [bool(generation_codec.PROMPT_PRESENT.search(t)) for t in texts] == ecma
    assert not ecma[texts.index("\u00a0\u3000\ufeff")] and ecma[texts.index("a cat\u00a0")]
