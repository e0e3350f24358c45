"""The score-shift histogram is a real PNG with bars where the counts are."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from worker.tools.replay import ReplayError
from worker.tools.replay.compare.histogram import (
    BAR,
    HEIGHT,
    MARGIN_L,
    MARGIN_R,
    WIDTH,
    write_histogram,
)


def _bar_columns(img: Image.Image) -> set[int]:
    px = img.load()
    assert px is not None
    return {x for x in range(img.width) for y in range(img.height) if px[x, y] == BAR}


def test_writes_a_valid_png_with_bars_in_the_right_bins(tmp_path: Path) -> None:
    edges = [-1.0, -0.5, 0.0, 0.5, 1.0]
    path = write_histogram(tmp_path / "out" / "h.png", edges, [0, 0, 0, 7], title="t",
                           xlabel="shift")
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (WIDTH, HEIGHT)
        cols = _bar_columns(img.convert("RGB"))
    plot_w = WIDTH - MARGIN_L - MARGIN_R
    assert cols, "a bar is drawn"
    assert min(cols) >= MARGIN_L + 3 * plot_w / 4, "only the last bin has a count"


def test_empty_counts_still_draw_axes(tmp_path: Path) -> None:
    path = write_histogram(tmp_path / "h.png", [-1.0, 0.0, 1.0], [0, 0], title="t", xlabel="x")
    with Image.open(path) as img:
        assert not _bar_columns(img.convert("RGB"))
        assert img.convert("L").getextrema()[0] < 100, "axes and labels are drawn"


def test_bad_input_and_unwritable_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_histogram(tmp_path / "h.png", [0.0, 1.0], [1, 2], title="t", xlabel="x")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReplayError):
        write_histogram(blocker / "h.png", [0.0, 1.0], [1], title="t", xlabel="x")
