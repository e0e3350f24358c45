"""The replay's progress line: done/total, rate in jobs/s, elapsed and ETA (rich.progress)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-- jobs/s" if speed is None else f"{speed:,.1f} jobs/s", style="cyan")


class ReplayProgress:
    """A context manager; ``enabled=False`` makes every call a no-op (tests, logs only)."""

    def __init__(self, description: str, total: int, done: int, *, enabled: bool,
                 console: Console | None = None, clock: Callable[[], float] | None = None
                 ) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            RateColumn(), TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), console=console or Console(stderr=True), disable=not enabled,
            speed_estimate_period=10.0, get_time=clock,
        )
        self._task = self._progress.add_task(description, total=total, completed=done)

    def update(self, done: int) -> None:
        self._progress.update(self._task, completed=done)

    def render(self) -> None:
        self._progress.refresh()

    def __enter__(self) -> ReplayProgress:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.stop()
