"""How ``topics create`` and ``lag`` print (rich tables for people, JSON for programs)."""

from __future__ import annotations

import json

import typer
from rich.console import Console, JustifyMethod
from rich.table import Table

from worker.tools.admin.lag import LagReport
from worker.tools.admin.topics_create import Outcome


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def print_topics(outcome: Outcome) -> None:
    console = _console()
    table = Table(box=None, pad_edge=False)
    columns: list[tuple[str, JustifyMethod]] = [
        ("role", "left"), ("topic", "left"), ("status", "left"), ("partitions", "right"),
        ("replication", "right"), ("max.message.bytes", "right")]
    for col, justify in columns:
        table.add_column(col, justify=justify, no_wrap=True)
    for r in outcome.rows:
        table.add_row(r.role, r.name, r.status, str(r.partitions), str(r.replication),
                      str(r.max_message_bytes))
    console.print(table)
    for note in outcome.notes:
        console.print(f"note: {note}", markup=False)
    for problem in outcome.problems:
        console.print(f"problem: {problem}", markup=False, style="bold red")


def print_lag(report: LagReport, *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(report.as_json(), indent=1))
        return
    console = _console()
    table = Table(title=f"group {report.group} on {report.topic}", box=None, pad_edge=False)
    for col in ("partition", "committed", "low", "high", "lag", "note"):
        table.add_column(col, justify="left" if col == "note" else "right", no_wrap=True)
    for p in report.partitions:
        table.add_row(str(p.partition), "-" if p.committed is None else str(p.committed),
                      str(p.low), str(p.high), str(p.lag), p.note)
    console.print(table)
    missing = report.without_commit
    console.print(f"total lag: {report.total}"
                  + (f" ({missing} of {len(report.partitions)} partitions without a commit)"
                     if missing else ""), markup=False)
