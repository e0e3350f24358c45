"""The tiny CLIP checkpoint of the CLIP suite (tests/unit/clip/conftest.py), shared with the
CLIP engine tests here."""

from __future__ import annotations

from tests.unit.tasks.moderation.clip.conftest import reference, tiny_clip

__all__ = ["reference", "tiny_clip"]
