"""The resumable state file: a small JSON document, replaced atomically at each checkpoint.

It holds the replay's identity (id, source topic, the resolved offset ranges, output topics,
engine), per partition the watermark ``next`` plus the handled offsets above it, and per
output partition ``scan_from``: the offset from which a resumed run must read that output to
find what the interrupted run wrote after this checkpoint (see :mod:`worker.tools.replay.scan`).

Writes go to a temporary file in the same directory, are fsync'ed, then renamed over the old
file (and the directory fsync'ed), so a crash at any moment leaves the old or the new state,
never a torn one.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.files import write_atomic
from worker.tools.replay.exceptions import ReplayError, StateMismatch
from worker.tools.replay.ledger import PartitionLedger

FORMAT = 1


@dataclass
class ReplayState:
    replay_id: str
    topic: str
    to_topic: str
    dlq_topic: str | None
    bounds: dict[str, str]  # {"from": ..., "to": ...} as given, for the mismatch check
    engine: str
    model: str
    partitions: dict[int, PartitionLedger]
    # Output topic -> partition -> offset to scan from on resume; "start" is where it began.
    scan_from: dict[str, dict[int, int]] = field(default_factory=dict)
    output_start: dict[str, dict[int, int]] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    finished: bool = False

    def totals(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for ledger in self.partitions.values():
            out.update(ledger.totals())
        return out

    def check_matches(self, *, topic: str, to_topic: str, dlq_topic: str | None,
                      bounds: dict[str, str], partitions: list[int] | None) -> None:
        """Refuse to resume with arguments that describe a different replay."""
        diffs = []
        if topic != self.topic:
            diffs.append(f"--topic {topic!r} (state: {self.topic!r})")
        if to_topic != self.to_topic:
            diffs.append(f"--to-topic {to_topic!r} (state: {self.to_topic!r})")
        if dlq_topic != self.dlq_topic:
            diffs.append(f"--dlq-topic {dlq_topic!r} (state: {self.dlq_topic!r})")
        for key in ("from", "to"):
            if bounds.get(key) != self.bounds.get(key):
                diffs.append(f"--{key} {bounds.get(key)!r} (state: {self.bounds.get(key)!r})")
        if partitions is not None and sorted(partitions) != sorted(self.partitions):
            diffs.append(f"--partitions {partitions} (state: {sorted(self.partitions)})")
        if diffs:
            raise StateMismatch("the state file describes another replay: " + "; ".join(diffs)
                                + ". Use another --state-file, or the original arguments.")

    # -- (de)serialisation -----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "replay_id": self.replay_id,
            "topic": self.topic,
            "to_topic": self.to_topic,
            "dlq_topic": self.dlq_topic,
            "bounds": self.bounds,
            "engine": self.engine,
            "model": self.model,
            "created_at": self.created_at,
            "updated_at": time.time(),
            "finished": self.finished,
            "partitions": {
                str(p): {"start": lg.start, "end": lg.end, "next": lg.next,
                         "done": {str(o): k for o, k in sorted(lg.done.items())},
                         "counts": dict(sorted(lg.counts.items()))}
                for p, lg in sorted(self.partitions.items())
            },
            "scan_from": _dump_offsets(self.scan_from),
            "output_start": _dump_offsets(self.output_start),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ReplayState:
        if doc.get("format") != FORMAT:
            raise StateMismatch(f"state file format {doc.get('format')!r} is not {FORMAT}")
        try:
            parts = {
                int(p): PartitionLedger(
                    start=int(d["start"]), end=int(d["end"]), next=int(d["next"]),
                    done={int(o): str(k) for o, k in d["done"].items()},
                    counts=Counter({str(k): int(v) for k, v in d["counts"].items()}),
                )
                for p, d in doc["partitions"].items()
            }
            return cls(
                replay_id=str(doc["replay_id"]), topic=str(doc["topic"]),
                to_topic=str(doc["to_topic"]), dlq_topic=doc.get("dlq_topic"),
                bounds={str(k): str(v) for k, v in doc["bounds"].items()},
                engine=str(doc["engine"]), model=str(doc["model"]), partitions=parts,
                scan_from=_load_offsets(doc["scan_from"]),
                output_start=_load_offsets(doc["output_start"]),
                created_at=float(doc["created_at"]), finished=bool(doc["finished"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateMismatch(f"state file is malformed: {exc!r}") from exc


def _dump_offsets(m: dict[str, dict[int, int]]) -> dict[str, dict[str, int]]:
    return {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in m.items()}


def _load_offsets(m: dict[str, dict[str, int]]) -> dict[str, dict[int, int]]:
    return {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in m.items()}


def load_state(path: Path) -> ReplayState | None:
    """The saved state, or None if there is no file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateMismatch(f"cannot read state file {path}: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateMismatch(f"state file {path} is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise StateMismatch(f"state file {path} is not a JSON object")
    return ReplayState.from_json(doc)


def save_state(path: Path, state: ReplayState) -> None:
    """Atomically replace ``path`` with ``state`` (temp file + fsync + rename + dir fsync)."""
    try:
        write_atomic(path, json.dumps(state.to_json(), indent=1).encode("utf-8"), sync_dir=True)
    except OSError as exc:
        raise ReplayError(f"cannot write state file {path}: {exc}") from exc


