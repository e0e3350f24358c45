"""A MemoryError while decoding one image must not stop the worker (it would stop at the same
record on every restart): decode_views collects and tries once more, then rejects the record."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from worker.exceptions import ImageRejected
from worker.tasks.moderation.images import cpu


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 100, 50)).save(buf, "PNG")
    return buf.getvalue()


def _fail_loads(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    calls: list[int] = []
    real = Image.Image.load

    def load(self: Image.Image) -> object:
        calls.append(1)
        if len(calls) <= times:
            raise MemoryError
        return real(self)

    monkeypatch.setattr(Image.Image, "load", load)
    return calls


def test_a_memory_error_once_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _png()
    calls = _fail_loads(monkeypatch, times=1)
    views = cpu.decode_views(data)
    assert [v.size for v in views] == [(32, 24)] and len(calls) >= 2


def test_a_memory_error_twice_rejects_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _png()
    _fail_loads(monkeypatch, times=10**6)
    with pytest.raises(ImageRejected, match="more memory than the worker has free"):
        cpu.decode_views(data)
