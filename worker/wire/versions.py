"""The contract's versions (``schemas/``, docs/wire-contract.md), shared by every topic.

A job's ``v`` picks the version of its result: a v1 job is answered exactly as before v2
existed (same payload bytes, header ``ktw.schema: <document>/v1``), a v2 job in v2. v1 stays
accepted during the transition to v2 and will be removed in a later release.
"""

from __future__ import annotations

VERSIONS = frozenset({1, 2})
V1, V2 = 1, 2


def schema_id(document: str, version: int) -> str:
    """The ``ktw.schema`` header of ``document`` (e.g. ``moderation-result``) at ``version``;
    the last part of the schema file's ``$id`` too."""
    return f"{document}/v{version}"


def schema_ids(document: str) -> dict[int, str]:
    """``schema_id`` for every version, looked up per record instead of formatted each time."""
    return {v: schema_id(document, v) for v in sorted(VERSIONS)}
