"""Command-line options shared by the ``trt-worker`` commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file.")]
