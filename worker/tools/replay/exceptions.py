"""Errors of the replay tool; all derive from :class:`worker.exceptions.WorkerError`."""

from __future__ import annotations

from worker.exceptions import WorkerError


class ReplayError(WorkerError):
    """A replay cannot start or continue. Fatal: the message says what to change."""


class BadRange(ReplayError):
    """The requested range is malformed or does not fit the topic; found before consuming."""


class UnknownTopic(BadRange):
    """A topic named on the command line does not exist on the cluster."""


class UnknownPartition(BadRange):
    """``--partitions`` names a partition the topic does not have."""


class StateMismatch(ReplayError):
    """The state file belongs to another replay (other topic, range, engine or format)."""
