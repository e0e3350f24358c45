"""The wire contract (``schemas/*.schema.json``) for tests of both suites.

The schemas use standard Draft 2020-12 keywords only, so any validator reads them. The msgpack
types follow from those keywords, and the schemas' descriptions spell them out:
``contentEncoding: base64`` marks a msgpack bin (bytes), any other string is a msgpack str,
``integer`` is a msgpack integer (never a float). A msgpack-side document (what the codec reads
or writes: bytes for bin) is checked through its JSON view (:func:`json_view`): bin becomes
base64 text where the schema says ``contentEncoding: base64``, and a msgpack type the schema does
not allow there (bytes where a str is due, a str where bin is due, a float where an integer is
due, which JSON Schema alone would accept as 1.0 == 1) is reported as an error. The JSON view
is then validated by a plain Draft 2020-12 validator (ECMA-262 ``$``: see :func:`ecma_pattern`).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "schemas"
EXAMPLE_VERSION = re.compile(r"v[0-9]+")


def ecma_pattern(pattern: str) -> str:
    """JSON Schema patterns are ECMA-262: a non-multiline ``$`` matches only at the very end.

    Python's ``$`` also matches before a trailing newline, so ``re.search`` (what jsonschema
    uses) would accept ``"abc\\n"`` for ``^[a-z]+$``. Our patterns have no ``$`` inside
    character classes, so swapping unescaped ``$`` for ``\\Z`` is exact for them.
    """
    return re.sub(r"(?<!\\)\$", r"\\Z", pattern)


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Any:
    if isinstance(instance, str) and re.search(ecma_pattern(pattern), instance) is None:
        yield ValidationError(f"{instance!r:.60} does not match {pattern!r}")


# The standard ``pattern`` keyword with ECMA-262 semantics; no keyword is added.
JsonValidator = jsonschema.validators.extend(Draft202012Validator, validators={"pattern": _pattern})


def is_bin(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("contentEncoding") == "base64"


def _types(schema: Any) -> list[str]:
    types = schema.get("type", []) if isinstance(schema, dict) else []
    return [types] if isinstance(types, str) else list(types)


def _sub(schema: Any, key: str, *, items: bool = False, index: int = 0) -> Any:
    """The subschema for a map key or an array index (the schema's own structure only:
    ``properties``/``additionalProperties``, ``prefixItems``/``items``)."""
    if not isinstance(schema, dict):
        return {}
    if items:
        prefix = schema.get("prefixItems", [])
        rest = schema.get("items")
        return prefix[index] if index < len(prefix) else (rest if isinstance(rest, dict) else {})
    extra = schema.get("additionalProperties")
    return schema.get("properties", {}).get(key, extra if isinstance(extra, dict) else {})


def json_view(schema: dict[str, Any], obj: Any) -> tuple[Any, list[str]]:
    """``obj`` (msgpack side) as JSON, and the msgpack types the schema does not allow."""
    problems: list[str] = []
    return _view(schema, obj, "#", problems), problems


def _view(schema: Any, obj: Any, where: str, problems: list[str]) -> Any:
    if isinstance(obj, bytes):
        if is_bin(schema):
            return base64.b64encode(obj).decode("ascii")
        problems.append(f"{where}: msgpack bin where the schema has no bin "
                        f"(type {_types(schema) or 'unset'})")
        return obj
    if isinstance(obj, str) and is_bin(schema):
        problems.append(f"{where}: msgpack str where msgpack bin is due")
    elif isinstance(obj, float) and "integer" in _types(schema) and "number" not in _types(
            schema):
        problems.append(f"{where}: msgpack float {obj!r} where an integer is due")
    elif isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                problems.append(f"{where}: map key {k!r} is not a msgpack str")
            out[k] = _view(_sub(schema, str(k)), v, f"{where}/{k}", problems)
        return out
    elif isinstance(obj, list):
        return [_view(_sub(schema, "", items=True, index=i), v, f"{where}/{i}", problems)
                for i, v in enumerate(obj)]
    return obj


def to_wire(schema: Any, obj: Any) -> Any:
    """The msgpack side of a JSON document: base64 text decoded to bytes where bin is due."""
    if is_bin(schema) and isinstance(obj, str):
        return base64.b64decode(obj, validate=True)
    if isinstance(obj, dict):
        return {k: to_wire(_sub(schema, k), v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_wire(_sub(schema, "", items=True, index=i), v) for i, v in enumerate(obj)]
    return obj


def schema_name(path: Path) -> str:
    return path.name.removesuffix(".schema.json")


class Contract:
    """The schema files by name (``moderation-result``, ``moderation-result.v2``, ...), a
    validator per schema, and both sides of an example."""

    ecma_pattern = staticmethod(ecma_pattern)

    def __init__(self, root: Path = SCHEMAS) -> None:
        self.root = root
        self.paths = {schema_name(p): p for p in sorted(root.glob("*.schema.json"))}
        self._schemas: dict[str, dict[str, Any]] = {
            name: json.loads(p.read_text()) for name, p in self.paths.items()}
        self._validators = {name: JsonValidator(s) for name, s in self._schemas.items()}

    @property
    def names(self) -> list[str]:
        return sorted(self._schemas)

    def schema(self, name: str) -> dict[str, Any]:
        return self._schemas[name]

    def name_for_example(self, example: Path) -> str:
        """``<document>[.v<N>].<what>.json`` -> ``<document>[.v<N>]``."""
        parts = example.name.split(".")
        name = parts[0]
        if len(parts) > 3 and EXAMPLE_VERSION.fullmatch(parts[1]):
            name = f"{parts[0]}.{parts[1]}"
        if name not in self._schemas:
            raise KeyError(f"no schema for example {example.name} ({name!r})")
        return name

    def json_errors(self, name: str, doc: Any) -> list[str]:
        """Errors of a JSON document (bin as base64 text), by the schema alone."""
        return [e.message for e in self._validators[name].iter_errors(doc)]

    def errors(self, name: str, instance: Any) -> list[str]:
        """Errors of a msgpack-side document (bin as bytes): its msgpack types, then its JSON
        view against the schema."""
        view, problems = json_view(self._schemas[name], instance)
        return problems + self.json_errors(name, view)

    def to_wire(self, name: str, obj: Any) -> Any:
        return to_wire(self._schemas[name], obj)

    def to_json(self, name: str, obj: Any) -> Any:
        return json_view(self._schemas[name], obj)[0]
