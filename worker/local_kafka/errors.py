"""Exception type for the local Kafka test broker."""

from __future__ import annotations


class LocalKafkaError(Exception):
    """Resolving jars, starting, or talking to the local broker failed.

    Messages carry the tail of mvn's output or of the broker log so a CI
    failure is diagnosable without the (usually deleted) work directory.
    """


def tail(text: str, max_lines: int = 60) -> str:
    """Last `max_lines` lines of `text`, for embedding in error messages."""
    lines = text.rstrip().splitlines()
    return "\n".join(lines[-max_lines:])
