"""Errors of the admin commands; all derive from :class:`worker.exceptions.WorkerError`
(the command line prints them and exits with status 2)."""

from __future__ import annotations

from worker.exceptions import UnknownTopic, WorkerError

__all__ = ["AdminError", "BadOption", "UnknownTopic"]


class AdminError(WorkerError):
    """An admin command cannot run as asked; the message says what to change."""


class BadOption(AdminError):
    """A command-line value is malformed (found before any broker is asked)."""
