"""``trt-worker replay``: the command (registered on the main app by :mod:`worker.tools.cli`).

Imports here stay light (typer, pathlib): the engine and Kafka load only when it runs.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from worker.tools.replay.runner import ReplaySummary

EXIT_STOPPED = 3  # interrupted before the end; the same command resumes it


def replay(
    topic: Annotated[str, typer.Option("--topic", "-t", help="Jobs topic to replay.")],
    to_topic: Annotated[str, typer.Option(
        "--to-topic", help="Topic for the replay's results (must exist; not a live topic).")],
    from_: Annotated[str, typer.Option(
        "--from", help="Start (inclusive): offset | epoch-ms | ISO-8601 time | earliest | now.",
    )] = "earliest",
    to: Annotated[str, typer.Option(
        "--to", help="End (exclusive): offset | epoch-ms | ISO-8601 time | latest | now.",
    )] = "latest",
    partitions: Annotated[str | None, typer.Option(
        help="Comma-separated partitions, e.g. 0,2 (default: all).")] = None,
    rate: Annotated[float | None, typer.Option(min=0.001, help="At most N jobs/s.")] = None,
    state_file: Annotated[Path | None, typer.Option(
        help="Resumable state (default: ./replay-TOPIC-to-TO_TOPIC.state.json).")] = None,
    compare: Annotated[str | None, typer.Option(
        "--compare", help="Old results topic: report what changed.")] = None,
    report_dir: Annotated[Path | None, typer.Option(
        help="Where the report goes (default: ./replay-report-REPLAYID).")] = None,
    dlq_topic: Annotated[str | None, typer.Option(
        help="Send rejected jobs here (default: count them only).")] = None,
    max_records: Annotated[int | None, typer.Option(
        min=1, help="Stop after N records this run (resumable).")] = None,
    top: Annotated[int, typer.Option(min=1, help="Changed jobs listed in the report.")] = 20,
    checkpoint_interval: Annotated[float, typer.Option(
        min=0.0, help="Seconds between state-file checkpoints.")] = 0.2,
    progress: Annotated[bool | None, typer.Option(
        "--progress/--no-progress", help="Progress bar (default: when stderr is a terminal).",
    )] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="TOML config file.")] = None,
    bootstrap_servers: Annotated[str | None, typer.Option(
        "--bootstrap-servers", "-b", help="Kafka brokers host:port,...")] = None,
) -> None:
    """Re-run a topic range through the current engine into a replay topic; resumable."""
    from worker.config import load_config
    from worker.logs import configure_logging
    from worker.tools.replay.exceptions import ReplayError
    from worker.tools.replay.ranges import check_order, parse_bound, parse_partitions
    from worker.tools.replay.start import ReplayRequest

    req = ReplayRequest(  # syntax errors first: they need no broker
        topic=topic, to_topic=to_topic,
        start=parse_bound(from_, option="--from"), end=parse_bound(to, option="--to"),
        state_file=state_file or Path(f"replay-{topic}-to-{to_topic}.state.json"),
        partitions=parse_partitions(partitions), rate=rate, dlq_topic=dlq_topic,
        max_records=max_records, checkpoint_interval_s=checkpoint_interval,
        progress=sys.stderr.isatty() if progress is None else progress,
    )
    check_order(req.start, req.end)
    overrides: dict[str, Any] = {}
    if bootstrap_servers:
        overrides["kafka"] = {"bootstrap_servers": bootstrap_servers}
    cfg = load_config(config, **overrides)
    configure_logging(cfg.log.level, cfg.log.format)
    if not cfg.kafka.bootstrap_servers:
        raise ReplayError("no brokers configured: set KAFKA_BOOTSTRAP_SERVERS or pass -b")
    summary = _run(cfg, req)
    _print_summary(summary, req.state_file)
    if compare is not None or report_dir is not None:
        _report(cfg, summary, compare, report_dir, top)
    if not summary.finished and max_records is None:
        raise typer.Exit(EXIT_STOPPED)


def _run(cfg: Any, req: Any) -> ReplaySummary:
    from worker.tools.replay.runner import ReplayRunner

    runner = ReplayRunner(cfg, req)

    def handler(signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second signal exits at once
        runner.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return runner.run()


def _print_summary(s: ReplaySummary, state_file: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"replay {s.replay_id}: {s.topic} -> {s.to_topic} ({s.engine})")
    for col in ("partition", "from", "to (excl.)", "records"):
        table.add_column(col, justify="right")
    for p, (start, end) in s.ranges.items():
        table.add_row(str(p), str(start), str(end), str(end - start))
    console = Console()
    console.print(table)
    counts = ", ".join(f"{k}={v}" for k, v in sorted(s.counts.items())) or "nothing yet"
    rate = s.handled_this_run / s.elapsed_s if s.elapsed_s > 0 else 0.0
    console.print(f"handled: {counts}")
    console.print(f"this run: {s.handled_this_run} in {s.elapsed_s:.1f} s ({rate:.1f} jobs/s)"
                  + (f", {s.recovered} found already written by the interrupted run"
                     if s.resumed else ""))
    if s.finished:
        console.print(f"[green]finished[/]; state: {state_file}")
    else:
        console.print(f"[yellow]stopped before the end[/]; the same command resumes from "
                      f"{state_file}")


def _report(cfg: Any, s: ReplaySummary, old_topic: str | None, report_dir: Path | None,
            top: int) -> None:
    import json

    from rich.console import Console

    from worker.kafka.admin import Admin
    from worker.tools.replay.compare.report import build_report, tables
    from worker.tools.replay.kafka import replay_consumer_settings

    out = report_dir or Path(f"replay-report-{s.replay_id}")
    out.mkdir(parents=True, exist_ok=True)
    summary = {"replay_id": s.replay_id, "topic": s.topic, "replay_topic": s.to_topic,
               "engine": s.engine, "finished": s.finished, "counts": dict(s.counts),
               "ranges": {str(p): list(r) for p, r in s.ranges.items()}}
    (out / "replay-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    console = Console()
    if old_topic is None:
        return
    if not s.finished:
        console.print("[yellow]not comparing: the replay has not reached its end[/]")
        return
    admin = Admin(cfg)
    conf = replay_consumer_settings(cfg, s.replay_id)
    report = build_report(admin, conf, s.state, old_topic, out, top_n=top)
    for table in tables(report.comparison, old_topic):
        console.print(table)
    console.print(f"report: {', '.join(str(f) for f in report.files)}")
