"""A tiny image classifier as a moderation model package, to show what adding a model takes.

A random-weight ONNX graph (average colour -> 2 logits -> softmax) run by onnxruntime, scoring
the fixed label ``bright`` (and reporting ``dark``). Everything it needs is in this folder: its
config section (``moderation.tiny``, :mod:`.settings`), preprocessing (:mod:`.preprocess`),
engine plan and ``engines build`` entry (:mod:`.engine`), parts and scoring (:mod:`.model`).
The record below is all the worker learns of it; a test makes it known with
``worker.tasks.moderation.models.register(PACKAGE)``.
"""

from worker.tasks.moderation.models.package import ModelPackage

PACKAGE = ModelPackage(
    name="tiny",
    model=f"{__name__}.model:TinyModel",
    settings=f"{__name__}.settings:TinySettings",
    engine_plans=f"{__name__}.engine:engine_plans",
    fixed_labels={"bright": (0.5, 0.9)},
    info_labels=("dark",),
)
