"""What every job codec and the DLQ read off a job's top-level msgpack map beyond
:func:`worker.wire.msgpack_map.unpack_map`: duplicate keys, the ``v`` a dead letter names,
and what counts as a blank text.

Duplicate keys: msgpack allows them and every decoder keeps one of the values (msgpack-python,
the last), so a job ``{"v": 1, "v": 3}`` would mean different things to different clients.
The contract refuses them (``schema``). A job is one flat map, so only the top level is
checked: a nested map in a job is a wrong-typed field whatever its keys.
"""

from __future__ import annotations

import collections
from typing import Any

import msgpack

from worker.exceptions import SchemaViolation

# The whitespace of ECMA-262's ``\s`` (WhiteSpace and LineTerminator) spelled out, so that the
# job schemas' "not blank" pattern means the same in every engine: RE2 (Go's validators) reads
# ``\s`` as ASCII only, Python's ``re`` adds U+001C-U+001F and U+0085 and drops U+FEFF. The
# schemas hold this exact class (tests/unit/wire/test_schemas.py), and
# tests/integration/contracts/test_schema_patterns.py runs it under ECMA-262 and RE2.
BLANK_CHARS = "\t\n\x0b\x0c\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NON_BLANK = f"[^{BLANK_CHARS}]"

_FIXMAP, _MAP16, _MAP32 = 0x80, 0xDE, 0xDF
_STR_TYPES = frozenset({*range(0xA0, 0xC0), 0xD9, 0xDA, 0xDB})  # fixstr, str 8/16/32
_INT_TYPES = frozenset({*range(0x00, 0x80), *range(0xE0, 0x100),  # fixints
                        *range(0xCC, 0xD4)})  # uint and int 8 to 64


def declared_len(payload: bytes) -> int | None:
    """The entry count the top-level map header of ``payload`` declares; None when the payload
    does not start with a map header."""
    if not payload:
        return None
    first = payload[0]
    if _FIXMAP <= first <= _FIXMAP + 0x0F:
        return first & 0x0F
    if first == _MAP16 and len(payload) >= 3:
        return int.from_bytes(payload[1:3], "big")
    if first == _MAP32 and len(payload) >= 5:
        return int.from_bytes(payload[1:5], "big")
    return None


def refuse_duplicate_keys(payload: bytes, obj: dict[Any, Any]) -> None:
    """:class:`SchemaViolation` when the map ``obj`` (unpacked from ``payload``) lost entries
    to duplicate keys: fewer entries than its header declares. A count read off the header
    for every job (~0.2 us); the keys are named only for a refused one."""
    if len(obj) == declared_len(payload):
        return
    counts = collections.Counter(_top_level_keys(payload))
    twice = sorted(repr(k) for k, n in counts.items() if n > 1)
    raise SchemaViolation(f"duplicate key(s) in the map: {', '.join(twice) or '?'}")


def _top_level_keys(payload: bytes) -> list[Any]:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False,
                                max_buffer_size=max(len(payload), 1))
    unpacker.feed(payload)
    keys = []
    for _ in range(unpacker.read_map_header()):
        keys.append(unpacker.unpack())
        unpacker.skip()
    return keys


def source_version(payload: bytes | None) -> int | None:
    """The integer ``v`` of a value that is one msgpack map, else None.

    For the DLQ header ``ktw.dlq.source.v``: any such map counts, also one the contract
    refuses (an extension type, invalid UTF-8 or a non-string key in another field, containers
    over the unpacker's bounds, a ``v`` this worker does not speak). Only the top level is
    read and nothing else is built: values are skipped. ``v`` is the msgpack str key ``"v"``
    with an integer value (not a bool, not a float); with duplicate keys, the last ``v``, as
    msgpack decoders keep it. A value that is not exactly one map (not msgpack, truncated,
    trailing bytes, another type) has none."""
    if not payload or declared_len(payload) is None:
        return None
    unpacker = msgpack.Unpacker(raw=True, max_buffer_size=len(payload))
    unpacker.feed(payload)
    found: object = None
    try:
        for _ in range(unpacker.read_map_header()):
            at = unpacker.tell()
            key = unpacker.unpack()
            is_v = key == b"v" and payload[at] in _STR_TYPES
            if is_v and payload[unpacker.tell()] in _INT_TYPES:
                found = unpacker.unpack()
            else:
                found = None if is_v else found
                unpacker.skip()
        if unpacker.tell() != len(payload):
            return None  # trailing bytes: not one map
    except (msgpack.UnpackException, ValueError, IndexError):
        # msgpack's own errors (out of data, a reserved byte, nesting deeper than its stack)
        return None
    return found if type(found) is int else None
