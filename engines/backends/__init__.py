"""Runners: one interface (activate / infer / deactivate) over every inference backend.

:mod:`engines.backends.registry` names the backends (onnxruntime, torch, tensorrt) and reaches
their builders and runners lazily; backends never import a model.
"""

from __future__ import annotations

from engines.backends.base import InferHandle, Runner

__all__ = ["InferHandle", "Runner"]
