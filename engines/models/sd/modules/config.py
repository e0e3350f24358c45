"""A ``config.json`` read into constructor arguments, refusing what these modules do not build.

Each module lists the keys it reads (with the reference library's default), the keys whose
value it can only take as the SD 1.5 layout has it (``fixed``), and the keys that cannot change
the modules built here (``ignored``, each with its reason where it is listed). Anything else is
a ``ValueError`` naming the key, so a checkpoint of another layout is refused at build time
instead of loading into a network that computes something else. Keys starting with ``_`` are
the libraries' bookkeeping (``_class_name``, ``_diffusers_version``, ``_name_or_path``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ConfigKeys:
    what: str  # the reference class, for messages
    used: Mapping[str, Any]  # key -> default
    # key -> the values supported, the first the default
    fixed: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    ignored: frozenset[str] = frozenset()
    # False where the library's config carries generic keys no architecture reads
    # (transformers' PretrainedConfig); the used and fixed keys are still checked.
    refuse_unknown: bool = True

    def read(self, config: Mapping[str, Any]) -> dict[str, Any]:
        out = {**self.used, **{k: allowed[0] for k, allowed in self.fixed.items()}}
        for key, value in config.items():
            if key.startswith("_") or key in self.ignored:
                continue
            if key in self.fixed and not _allowed(value, self.fixed[key]):
                raise ValueError(f"{self.what} config: {key}={value!r} is not supported "
                                 f"(supported: {' or '.join(map(repr, self.fixed[key]))})")
            if key in self.used or key in self.fixed:
                out[key] = tuple(value) if isinstance(value, list) else value
            elif self.refuse_unknown:
                raise ValueError(f"{self.what} config: key {key!r} is not supported (value "
                                 f"{value!r}); only the SD 1.5 layout is built here")
        return out

    def error(self, key: str, value: Any, expected: str) -> ValueError:
        return ValueError(f"{self.what} config: {key}={value!r} is not supported ({expected})")


def _allowed(value: Any, allowed: tuple[Any, ...]) -> bool:
    if isinstance(value, list | tuple):  # a per-block list: every entry must be allowed
        return len(value) > 0 and all(_allowed(v, allowed) for v in value)
    # None and booleans by identity: 0 is not False, and "" is not None.
    return any(value is a if a is None or isinstance(a, bool) else value == a for a in allowed)


def per_block(keys: ConfigKeys, cfg: Mapping[str, Any], key: str, blocks: int) -> tuple[int, ...]:
    """An int for every block, or a list with one per block (diffusers accepts both)."""
    value = cfg[key]
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * blocks
    if (isinstance(value, tuple) and len(value) == blocks
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        return value
    raise keys.error(key, value, f"an int or {blocks} ints, one per block")


def positive_int(keys: ConfigKeys, cfg: Mapping[str, Any], key: str) -> int:
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise keys.error(key, value, "a positive int")
    return value
