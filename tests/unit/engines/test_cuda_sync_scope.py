"""No device-wide CUDA synchronisation in the engines or the worker: with both tasks in one
process, one task's engines capture CUDA graphs while the other's run, and CUDA refuses a
device-wide sync during any capture (and invalidates that capture). Streams and events are
synchronised instead; the allocator's cache is emptied only through
``engines.backends.torch.graphs.empty_cache``, which waits for any capture to end."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


GUARDED = ROOT / "engines" / "backends" / "torch" / "graphs.py"


def _device_syncs(path: Path) -> list[int]:
    """Lines calling torch.cuda.synchronize (or, outside graphs.py, torch.cuda.empty_cache)."""
    names = {"synchronize"} | ({"empty_cache"} if path != GUARDED else set())
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in names
            and ast.unparse(node.func.value) in ("torch.cuda", "cuda")]


@pytest.mark.parametrize("package", ["engines", "worker"])
def test_no_device_wide_synchronize(package: str) -> None:
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / package).rglob("*.py"))
             if (lines := _device_syncs(p))}
    assert not found, f"device-wide synchronize (use the stream's or an event's): {found}"


def test_the_scan_finds_a_device_wide_synchronize(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import torch\ntorch.cuda.synchronize()\ntorch.cuda.current_stream()"
                   ".synchronize()\nstream.synchronize()\ntorch.cuda.empty_cache()\n")
    assert _device_syncs(src) == [2, 5]


def _graph_captures_without_own_stream(path: Path) -> list[int]:
    """Lines entering torch.cuda.graph without ``stream=``: it then captures on one of torch's
    pooled streams, which torch.cuda.Stream() also hands to other threads."""
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "graph" and ast.unparse(node.func.value) in ("torch.cuda", "cuda")
            and not any(k.arg == "stream" for k in node.keywords)]


@pytest.mark.parametrize("package", ["engines", "worker"])
def test_graphs_are_captured_on_a_stream_of_their_own(package: str) -> None:
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / package).rglob("*.py"))
             if (lines := _graph_captures_without_own_stream(p))}
    assert not found, f"torch.cuda.graph on a pooled stream (pass stream=): {found}"


def test_the_scan_finds_a_capture_on_a_pooled_stream(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import torch\nwith torch.cuda.graph(g):\n    pass\n"
                   "with torch.cuda.graph(g, stream=s):\n    pass\n")
    assert _graph_captures_without_own_stream(src) == [2]
