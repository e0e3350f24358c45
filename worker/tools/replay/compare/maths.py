"""What changed between an old results topic and a replay: pure maths over decoded results.

Results are joined by job id (the last result of an id wins on each side, as a compacted topic
would keep it). A job's *outcome* is its verdict, or ``(status)`` when it has none (expired,
error): an old ``(expired)`` that the replay scores ``allow`` is a change too. Score shifts
are ``new - old`` per score label present on both sides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

HISTOGRAM_BINS = 41  # odd: one bin is centred on "no shift"


@dataclass(frozen=True, slots=True)
class ResultView:
    """The parts of a result that a comparison uses."""

    id: str
    status: str
    verdict: str | None
    scores: Mapping[str, float]
    engine: str | None = None

    @property
    def outcome(self) -> str:
        return self.verdict or f"({self.status})"


def view_of(doc: Mapping[str, Any]) -> ResultView | None:
    """A decoded result payload as a :class:`ResultView`; None if it is not a result."""
    rid, status = doc.get("id"), doc.get("status")
    if not isinstance(rid, str) or not isinstance(status, str):
        return None
    raw = doc.get("scores")
    scores = {str(k): float(v) for k, v in raw.items()
              if isinstance(v, int | float)} if isinstance(raw, dict) else {}
    verdict = doc.get("verdict")
    engine = doc.get("engine_hash")
    return ResultView(rid, status, verdict if isinstance(verdict, str) else None, scores,
                      engine if isinstance(engine, str) else None)


@dataclass(frozen=True, slots=True)
class ShiftStats:
    label: str
    n: int
    mean: float | None  # None when no job has this label on both sides
    median: float | None
    p95_abs: float | None
    max_abs: float | None
    changed: int  # |shift| > 1e-6
    edges: list[float]
    counts: list[int]


@dataclass(frozen=True, slots=True)
class ChangedJob:
    id: str
    old: str
    new: str
    shifts: dict[str, float]
    max_abs_shift: float

    @property
    def verdict_changed(self) -> bool:
        return self.old != self.new


@dataclass
class Comparison:
    matched: int = 0
    only_new: int = 0  # replayed jobs with no old result
    verdict_changed: int = 0
    transitions: dict[str, dict[str, int]] = field(default_factory=dict)  # old -> new -> n
    changed_by_label: dict[str, dict[str, int]] = field(default_factory=dict)
    shifts: dict[str, ShiftStats] = field(default_factory=dict)
    top: list[ChangedJob] = field(default_factory=list)
    old_engines: dict[str, int] = field(default_factory=dict)
    new_engines: dict[str, int] = field(default_factory=dict)

    def changes(self) -> dict[str, int]:
        """``"old->new": n`` for every pair that differs."""
        return {f"{a}->{b}": n for a, row in sorted(self.transitions.items())
                for b, n in sorted(row.items()) if a != b}

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["changes"] = self.changes()
        return doc


def histogram(values: Sequence[float], bins: int = HISTOGRAM_BINS
              ) -> tuple[list[float], list[int]]:
    """Counts over a range symmetric around 0 that holds every value (edges: bins + 1)."""
    span = max((abs(v) for v in values), default=0.0)
    span = span * 1.0001 if span > 1e-6 else 1e-6
    counts, edges = np.histogram(np.asarray(values, dtype=np.float64), bins=bins,
                                 range=(-span, span))
    return [float(e) for e in edges], [int(c) for c in counts]


def shift_stats(label: str, values: Sequence[float]) -> ShiftStats:
    edges, counts = histogram(values)
    if not values:
        return ShiftStats(label, 0, None, None, None, None, 0, edges, counts)
    arr = np.asarray(values, dtype=np.float64)
    mags = np.abs(arr)
    return ShiftStats(
        label, len(values), float(arr.mean()), float(np.median(arr)),
        float(np.percentile(mags, 95)), float(mags.max()), int((mags > 1e-6).sum()),
        edges, counts,
    )


def compare(new: Mapping[str, ResultView], old: Mapping[str, ResultView], *, top_n: int = 20
            ) -> Comparison:
    out = Comparison()
    transitions: dict[str, Counter[str]] = {}
    gained: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    shifts: dict[str, list[float]] = {}
    changed: list[ChangedJob] = []
    out.new_engines = dict(Counter(v.engine or "?" for v in new.values()))
    for job_id, n in sorted(new.items()):
        o = old.get(job_id)
        if o is None:
            out.only_new += 1
            continue
        out.matched += 1
        out.old_engines[o.engine or "?"] = out.old_engines.get(o.engine or "?", 0) + 1
        transitions.setdefault(o.outcome, Counter())[n.outcome] += 1
        job_shifts = {k: n.scores[k] - o.scores[k] for k in n.scores if k in o.scores}
        for k, s in job_shifts.items():
            shifts.setdefault(k, []).append(s)
        if o.outcome != n.outcome:
            out.verdict_changed += 1
            lost[o.outcome] += 1
            gained[n.outcome] += 1
        biggest = max((abs(s) for s in job_shifts.values()), default=0.0)
        if o.outcome != n.outcome or biggest > 1e-6:
            changed.append(ChangedJob(job_id, o.outcome, n.outcome, job_shifts, biggest))
    out.transitions = {a: dict(sorted(row.items())) for a, row in sorted(transitions.items())}
    out.changed_by_label = {
        label: {"gained": gained[label], "lost": lost[label]}
        for label in sorted(set(gained) | set(lost))
    }
    out.shifts = {k: shift_stats(k, v) for k, v in sorted(shifts.items())}
    changed.sort(key=lambda c: (not c.verdict_changed, -c.max_abs_shift, c.id))
    out.top = changed[:top_n]
    return out
