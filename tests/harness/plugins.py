"""Model plug-ins as an installed distribution would declare them: a ``*.dist-info`` folder
with an ``entry_points.txt``, written to a folder that goes on ``PYTHONPATH``. A worker
process started with it knows the plug-in's models through entry points alone, as after a
``pip install`` of a package that declares them."""

from __future__ import annotations

from pathlib import Path

from worker.tasks.moderation.models import ENTRY_POINT_GROUP

# The tiny test classifier (average colour -> 2 scores): cheap enough that a fault drill's
# workers keep up with thousands of jobs/s on a 2-core machine, so the drill measures the
# delivery path and not a CPU's convolution speed.
TINY = {"tiny": "tests.unit.tasks.moderation.tiny_model:PACKAGE"}


def write_plugin_dist(folder: Path, entries: dict[str, str], name: str = "ktw_test_plugin"
                      ) -> Path:
    """A distribution ``name`` declaring ``entries`` (model name -> ``module:attribute``) in
    ``folder``; returns ``folder`` (to put on ``sys.path`` / ``PYTHONPATH``)."""
    info = folder / f"{name}-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{k} = {v}" for k, v in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return folder
