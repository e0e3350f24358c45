"""Shared fixtures for the unit suite (no broker, no network).

- ``contract``: the JSON Schema files in ``schemas/`` as validators that understand the
  msgpack side of the wire (``x-msgpack-type``; bytes count as JSON Schema strings).
- ``sample_path``: any test asking for it runs once per image in ``worker/samples``.
- The environment is scrubbed of ``KTW_*`` and ``KAFKA_BOOTSTRAP_SERVERS`` per module, so a
  developer's shell cannot change what ``load_config()`` returns in these tests.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

import worker

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO / "schemas"
SAMPLES_DIR = Path(worker.__file__).parent / "samples"
SAMPLES = sorted(p for p in SAMPLES_DIR.iterdir() if p.suffix.lower() != ".md")


@pytest.fixture(scope="module", autouse=True)
def _hermetic_env() -> Iterator[None]:
    # Module scope (not session): autouse fixtures run before the module's other fixtures, and
    # the environment is restored after each module, so integration tests run later in the same
    # session still see the caller's KAFKA_BOOTSTRAP_SERVERS.
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("KTW_") or name == "KAFKA_BOOTSTRAP_SERVERS":
                mp.delenv(name)
        yield


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sample_path" in metafunc.fixturenames:
        metafunc.parametrize("sample_path", SAMPLES, ids=[p.name for p in SAMPLES])


@pytest.fixture(scope="session")
def sample_paths() -> list[Path]:
    assert len(SAMPLES) >= 8, f"expected the bundled sample images in {SAMPLES_DIR}"
    return SAMPLES


# --- the wire contract as a validator ----------------------------------------------------------


def _msgpack_type(validator: Any, kind: str, instance: Any, schema: dict[str, Any]) -> Any:
    """``x-msgpack-type``: "str" needs a Python str, "bin" needs bytes; None only if nullable."""
    if instance is None:
        types = schema.get("type", [])
        if "null" not in ([types] if isinstance(types, str) else types):
            yield ValidationError(f"null is not allowed (x-msgpack-type {kind})")
        return
    want = {"str": str, "bin": bytes}.get(kind)
    if want is None:
        yield ValidationError(f"unknown x-msgpack-type {kind!r}")
    elif not isinstance(instance, want):
        yield ValidationError(f"{instance!r:.60} is not msgpack {kind} ({type(instance).__name__})")


def ecma_pattern(pattern: str) -> str:
    """JSON Schema patterns are ECMA-262: a non-multiline ``$`` matches only at the very end.

    Python's ``$`` also matches before a trailing newline, so ``re.search`` (what jsonschema
    uses) would accept ``"abc\\n"`` for ``^[a-z]+$``. Our patterns have no ``$`` inside
    character classes, so swapping unescaped ``$`` for ``\\Z`` is exact for them.
    """
    return re.sub(r"(?<!\\)\$", r"\\Z", pattern)


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Any:
    # bytes where a str is due are x-msgpack-type's to report; patterns only apply to str.
    if isinstance(instance, str) and re.search(ecma_pattern(pattern), instance) is None:
        yield ValidationError(f"{instance!r:.60} does not match {pattern!r}")


_TYPES = Draft202012Validator.TYPE_CHECKER.redefine(
    "string", lambda _checker, inst: isinstance(inst, str | bytes)
)
WireValidator = jsonschema.validators.extend(
    Draft202012Validator,
    validators={"x-msgpack-type": _msgpack_type, "pattern": _pattern},
    type_checker=_TYPES,
)


class Contract:
    """The schema files, a validator per schema, and JSON-example -> msgpack-side conversion."""

    ecma_pattern = staticmethod(ecma_pattern)

    def __init__(self, root: Path) -> None:
        self.root = root
        self._schemas: dict[str, dict[str, Any]] = {}
        for path in sorted(root.glob("*.schema.json")):
            schema = json.loads(path.read_text())
            Draft202012Validator.check_schema(schema)
            self._schemas[path.name.removesuffix(".schema.json")] = schema

    @property
    def names(self) -> list[str]:
        return sorted(self._schemas)

    def schema(self, name: str) -> dict[str, Any]:
        return self._schemas[name]

    def name_for_example(self, example: Path) -> str:
        prefix = example.name.split(".", 1)[0]
        if prefix not in self._schemas:
            raise KeyError(f"no schema for example {example.name} (prefix {prefix!r})")
        return prefix

    def validator(self, name: str) -> Any:
        return WireValidator(self._schemas[name])

    def errors(self, name: str, instance: Any) -> list[str]:
        return [e.message for e in self.validator(name).iter_errors(instance)]

    def to_wire(self, name: str, obj: Any) -> Any:
        """The msgpack-side form of a JSON example: ``bin`` fields base64-decoded to bytes."""
        return _to_wire(self._schemas[name], obj)


def _to_wire(schema: dict[str, Any], obj: Any) -> Any:
    if schema.get("x-msgpack-type") == "bin" and isinstance(obj, str):
        return base64.b64decode(obj, validate=True)
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        fallback = extra if isinstance(extra, dict) else {}
        return {k: _to_wire(props.get(k, fallback), v) for k, v in obj.items()}
    if isinstance(obj, list):
        prefix = schema.get("prefixItems", [])
        items = schema.get("items")
        rest = items if isinstance(items, dict) else {}
        return [_to_wire(prefix[i] if i < len(prefix) else rest, v) for i, v in enumerate(obj)]
    return obj


@pytest.fixture(scope="session")
def contract() -> Contract:
    return Contract(SCHEMAS)
