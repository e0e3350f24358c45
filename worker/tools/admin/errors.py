"""Errors of the admin commands; all derive from :class:`worker.exceptions.WorkerError`
(the command line prints them and exits with status 2)."""

from __future__ import annotations

from worker.exceptions import WorkerError


class AdminError(WorkerError):
    """An admin command cannot run as asked; the message says what to change."""


class UnknownTopic(AdminError):
    """A topic the command needs does not exist on the cluster."""


class BadOption(AdminError):
    """A command-line value is malformed (found before any broker is asked)."""
