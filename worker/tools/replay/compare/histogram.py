"""A bar histogram of score shifts as a PNG, drawn with Pillow (no plotting library needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from worker.tools.replay.exceptions import ReplayError

WIDTH, HEIGHT = 900, 520
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 80, 30, 50, 70
BAR = (52, 101, 164)
ZERO = (204, 0, 0)
INK = (30, 30, 30)
GRID = (225, 225, 225)


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except (OSError, TypeError, ValueError):  # Pillow built without FreeType
        return ImageFont.load_default()


def _fmt(x: float) -> str:
    return f"{x:+.2e}" if x and abs(x) < 1e-3 else f"{x:+.3f}"


def draw_histogram(edges: Sequence[float], counts: Sequence[int], *, title: str,
                   xlabel: str, ylabel: str = "jobs") -> Image.Image:
    if len(edges) != len(counts) + 1 or not counts:
        raise ValueError("need len(edges) == len(counts) + 1 >= 2")
    img = Image.new("RGB", (WIDTH, HEIGHT), "white")
    d = ImageDraw.Draw(img)
    small, big = _font(13), _font(16)
    x0, x1 = MARGIN_L, WIDTH - MARGIN_R
    y0, y1 = HEIGHT - MARGIN_B, MARGIN_T  # y0: the x axis (bottom), y1: the top
    top = max(max(counts), 1)
    for i in range(5):  # horizontal grid lines with count labels
        y = y0 - (y0 - y1) * i / 4
        d.line([(x0, y), (x1, y)], fill=GRID)
        d.text((x0 - 8, y), f"{top * i / 4:.0f}", fill=INK, font=small, anchor="rm")
    lo, hi = edges[0], edges[-1]
    width = (x1 - x0) / len(counts)
    for i, c in enumerate(counts):
        if c:
            h = (y0 - y1) * c / top
            d.rectangle([x0 + i * width + 1, y0 - h, x0 + (i + 1) * width - 1, y0], fill=BAR)
    if lo < 0 < hi:  # mark "no change"
        xz = x0 + (x1 - x0) * (0 - lo) / (hi - lo)
        d.line([(xz, y1), (xz, y0)], fill=ZERO, width=1)
    d.line([(x0, y0), (x1, y0)], fill=INK, width=2)
    d.line([(x0, y0), (x0, y1)], fill=INK, width=2)
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = x0 + (x1 - x0) * frac
        d.line([(x, y0), (x, y0 + 5)], fill=INK)
        d.text((x, y0 + 8), _fmt(lo + (hi - lo) * frac), fill=INK, font=small, anchor="ma")
    d.text(((x0 + x1) / 2, HEIGHT - 22), xlabel, fill=INK, font=big, anchor="mm")
    d.text(((x0 + x1) / 2, 22), title, fill=INK, font=big, anchor="mm")
    label = Image.new("RGB", (200, 24), "white")
    ImageDraw.Draw(label).text((100, 12), ylabel, fill=INK, font=big, anchor="mm")
    img.paste(label.rotate(90, expand=True), (8, (y0 + y1) // 2 - 100))
    return img


def write_histogram(path: Path, edges: Sequence[float], counts: Sequence[int], *, title: str,
                    xlabel: str) -> Path:
    img = draw_histogram(edges, counts, title=title, xlabel=xlabel)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        img.save(path, format="PNG")
    except OSError as exc:
        raise ReplayError(f"cannot write histogram {path}: {exc}") from exc
    return path
