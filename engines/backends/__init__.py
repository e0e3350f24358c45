"""Runners: one interface (activate / infer / deactivate) over every inference backend."""

from __future__ import annotations

from engines.backends.base import InferHandle, Runner

__all__ = ["InferHandle", "Runner"]
