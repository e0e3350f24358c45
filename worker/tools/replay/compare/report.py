"""``--compare``: read both results topics, compare, write JSON + a text table + PNG histograms.

New results are the replay's own: read from where its output topic stood when the replay
began, keeping only records whose ``ktw.replay.id`` is this replay's. Old results are the
whole old topic up to its current end. Both are joined by job id (see :mod:`compare`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from rich.console import Console
from rich.table import Table

from worker.exceptions import JobRejected
from worker.kafka.admin import Admin
from worker.kafka.headers import read_headers
from worker.kafka.reader import read_ranges
from worker.tools.replay.compare.histogram import write_histogram
from worker.tools.replay.compare.maths import Comparison, ResultView, compare, view_of
from worker.tools.replay.exceptions import ReplayError
from worker.tools.replay.headers import REPLAY_ID, as_dict
from worker.tools.replay.kafka import topic_ends
from worker.tools.replay.state import ReplayState
from worker.wire.moderation_codec import decode_result

JSON_NAME, TEXT_NAME = "replay-report.json", "replay-report.txt"


@dataclass
class Report:
    comparison: Comparison
    old_topic: str
    new_count: int
    old_count: int
    files: list[Path]


def read_results(admin: Admin, conf: Mapping[str, Any], topic: str,
                 starts: dict[int, int] | None = None, replay_id: str | None = None
                 ) -> dict[str, ResultView]:
    """Job id -> last result in ``topic`` (from ``starts``, else the beginning, to the end)."""
    marks = topic_ends(admin, topic)
    ranges = {p: ((starts or {}).get(p, low), high) for p, (low, high) in marks.items()}
    out: dict[str, ResultView] = {}

    def on_message(msg: ck.Message) -> None:
        if replay_id is not None and (as_dict(read_headers(msg)[0]).get(REPLAY_ID)
                                      != replay_id.encode()):
            return
        try:
            view = view_of(decode_result(msg.value() or b""))
        except JobRejected:
            return  # not a result payload: nothing to compare
        if view is not None:
            out[view.id] = view

    read_ranges(conf, topic, ranges, on_message)
    return out


def build_report(admin: Admin, conf: Mapping[str, Any], state: ReplayState, old_topic: str,
                 report_dir: Path, *, top_n: int = 20) -> Report:
    new = read_results(admin, conf, state.to_topic, state.output_start.get(state.to_topic),
                       state.replay_id)
    old = read_results(admin, conf, old_topic)
    comparison = compare(new, old, top_n=top_n)
    files = write_report(comparison, state, old_topic, report_dir)
    return Report(comparison, old_topic, len(new), len(old), files)


def write_report(c: Comparison, state: ReplayState, old_topic: str, report_dir: Path
                 ) -> list[Path]:
    doc = {"replay_id": state.replay_id, "topic": state.topic, "replay_topic": state.to_topic,
           "old_results_topic": old_topic, "engine": state.engine, **c.to_json()}
    files = []
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
        path = report_dir / JSON_NAME
        path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        files.append(path)
        console = Console(record=True, width=110, file=io.StringIO())
        for table in tables(c, old_topic):
            console.print(table)
        text = report_dir / TEXT_NAME
        text.write_text(console.export_text(), encoding="utf-8")
        files.append(text)
    except OSError as exc:
        raise ReplayError(f"cannot write the report in {report_dir}: {exc}") from exc
    for label, s in c.shifts.items():
        files.append(write_histogram(
            report_dir / f"score-shift-{label}.png", s.edges, s.counts,
            title=f"{label} score shift (new - old), {s.n} jobs, {s.changed} changed",
            xlabel=f"{label} score: replay minus old result",
        ))
    return files


def tables(c: Comparison, old_topic: str) -> list[Table]:
    head = Table(title=f"replay vs {old_topic}", show_header=False)
    head.add_row("jobs compared", str(c.matched))
    head.add_row("no old result", str(c.only_new))
    head.add_row("verdict changed", str(c.verdict_changed))
    labels = sorted(set(c.transitions) | {b for row in c.transitions.values() for b in row})
    matrix = Table(title="verdicts: old (rows) -> replay (columns)")
    matrix.add_column("old \\ new")
    for label in labels:
        matrix.add_column(label, justify="right")
    for a in labels:
        row = c.transitions.get(a, {})
        matrix.add_row(a, *(_cell(row.get(b, 0), a != b) for b in labels))
    shifts = Table(title="score shifts (replay - old)")
    for col in ("label", "jobs", "changed", "mean", "median", "p95 |shift|", "max |shift|"):
        shifts.add_column(col, justify="left" if col == "label" else "right")
    for s in c.shifts.values():
        shifts.add_row(s.label, str(s.n), str(s.changed),
                       *(_num(v) for v in (s.mean, s.median, s.p95_abs, s.max_abs)))
    top = Table(title=f"jobs that changed most (top {len(c.top)})")
    for col in ("job", "old", "new", "largest shift"):
        top.add_column(col, justify="right" if col == "largest shift" else "left")
    for j in c.top:
        top.add_row(j.id, j.old, j.new, _num(max(j.shifts.values(), key=abs, default=0.0)))
    return [head, matrix, shifts, top]


def _cell(n: int, off_diagonal: bool) -> str:
    return f"[bold red]{n}[/]" if n and off_diagonal else str(n)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:+.6f}"
