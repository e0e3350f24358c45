"""The record a model package registers: what the rest of the worker may know about a model.

Everything the config, the task, the policies and ``trt-worker engines build`` need of a model
comes from its :class:`ModelPackage` (``PACKAGE`` in its ``__init__.py``), found by name in
:data:`worker.tasks.moderation.models.MODELS`. Code is named as ``"module:attribute"`` and
imported on first use, so knowing a model (validating a config that names it) imports only its
record and its settings class, never its engines.

Imports nothing of the worker at module level: the config's validators read the registry.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from engines.assembly import EnginePlan
    from worker.config import WorkerConfig
    from worker.config.moderation import ModelSection
    from worker.config.policies import PolicySettings
    from worker.tasks.moderation.models.base import ModerationModel
    from worker.wire.moderation_jobs import Verdict

MODEL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class RuleHit(NamedTuple):
    """A policy rule a model contributes, when it decides: the verdict, its machine-readable
    rule (``"review:clip.consistency"``) and a reason for people."""

    verdict: Verdict
    rule: str
    reason: str


# (policy, the model's scores of one job by label) -> a hit, or None to let the next rule decide.
Rule = Callable[["PolicySettings", Mapping[str, float]], RuleHit | None]


def load(entry: str) -> Any:
    """The object ``"package.module:name"`` names (its module imported now)."""
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ModelPackage:
    """One model, as its package declares it.

    ``fixed_labels``: the labels it always scores, with their default (review, block)
    thresholds (open_nsfw: ``nsfw``); a policy running the model gets them unless it sets
    them. ``describes``: it scores any policy label that has ``descriptions`` (text, CLIP).
    ``info_labels``: scores it reports beside the labels, never a threshold (reserved label
    names). ``policy_options`` / ``label_options``: fields of a policy / of a label only this
    model reads (refused in a policy that does not run it). ``rules``: checks that decide
    after the threshold rules (``(policy, scores) -> RuleHit | None``, in registry order)."""

    name: str
    model: str  # "module:Class", a ModerationModel subclass
    settings: str | None = None  # "module:Class", a ModelSection: its section moderation.<name>
    engine_plans: str | None = None  # "module:function", (cfg) -> {engine name: EnginePlan}
    fixed_labels: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    describes: bool = False
    info_labels: tuple[str, ...] = ()
    policy_options: tuple[str, ...] = ()
    label_options: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()  # "module:function" each, a Rule

    def __post_init__(self) -> None:
        if not MODEL_NAME.fullmatch(self.name):
            raise ValueError(f"model name {self.name!r} must match {MODEL_NAME.pattern}")

    def model_class(self) -> type[ModerationModel]:
        cls: type[ModerationModel] = load(self.model)
        return cls

    def settings_class(self) -> type[ModelSection] | None:
        return None if self.settings is None else load(self.settings)

    def plans(self, cfg: WorkerConfig) -> dict[str, EnginePlan]:
        """Its ``engines build`` entry: every engine it loads under ``cfg``, by name."""
        return {} if self.engine_plans is None else dict(load(self.engine_plans)(cfg))

    def rule_functions(self) -> list[Rule]:
        return [load(r) for r in self.rules]

    def scores_label(self, label: str, described: bool) -> bool:
        """Whether it scores ``label`` (``described``: the label has descriptions)."""
        return label in self.fixed_labels or (self.describes and described)
