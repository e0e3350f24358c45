"""Exception type for the local Kafka test broker."""

from __future__ import annotations

import re

from worker.exceptions import WorkerError

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class LocalKafkaError(WorkerError):
    """Resolving jars, starting, or talking to the local broker failed (fatal).

    Messages carry the tail of mvn's output or of the broker log so a CI
    failure is diagnosable without the (usually deleted) work directory.
    """


def tail(text: str, max_lines: int = 60) -> str:
    """Last `max_lines` lines of `text`, for embedding in error messages."""
    lines = _ANSI.sub("", text).rstrip().splitlines()  # mvn 3.8 emits colour resets even with -B
    return "\n".join(lines[-max_lines:])
