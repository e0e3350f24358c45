"""The broker's work directory: ours (temp, deleted) or the caller's (kept)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
KEEP_ENV = "KTW_KEEP_KAFKA_LOGS"


def acquire(given: Path | None) -> tuple[Path, Path | None]:
    """Return (workdir, tmpdir); tmpdir is set only when we created it and may delete it."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        return given, None
    tmp = Path(tempfile.mkdtemp(prefix="local-kafka-"))
    return tmp, tmp


def release(tmpdir: Path | None, *, failed: bool, keep_on_failure: bool) -> None:
    """Delete our temp workdir unless logs are wanted for a post-mortem."""
    if tmpdir is None:
        return  # caller-provided workdir: never delete
    if os.environ.get(KEEP_ENV) == "1" or (failed and keep_on_failure):
        log.warning("keeping local Kafka workdir %s", tmpdir)
    else:
        shutil.rmtree(tmpdir, ignore_errors=True)
