"""Image-and-text policies (``moderation.policies``): the models a policy runs and its labels.

A policy names the models it runs (any registered model:
:data:`worker.tasks.moderation.models.MODELS`) and its labels. What a model scores comes from its
package's record (:class:`worker.tasks.moderation.models.package.ModelPackage`): a model with
fixed labels (open_nsfw: ``nsfw``) scores those, a describing model (text, CLIP) every label with
``descriptions``. Each label has review/block thresholds, optionally overridden per model, since
the models' scores live on different scales. Everything here is checked at start-up;
:mod:`worker.tasks.moderation.scoring.policies` turns scores into a verdict.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, model_validator

from worker.config.base import Section
from worker.config.names import ModelName, model_package, model_packages

LABEL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def info_labels(model: str) -> tuple[str, ...]:
    """The scores ``model`` reports next to the policy's labels (never a label's name)."""
    return model_package(model).info_labels


class LabelThresholds(Section):
    review: float = Field(0.5, ge=0, le=1)
    block: float = Field(0.9, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> LabelThresholds:
        if self.review > self.block:
            raise ValueError("review threshold must not exceed block threshold")
        return self


class LabelSettings(LabelThresholds):
    # Short phrases, each one way the label shows up in text ("threatening to kill someone");
    # the label's similarity is the best match over them.
    descriptions: list[str] = Field(default_factory=list)
    # CLIP prompts; default "a photo of <description>" for each description.
    clip_prompts: list[str] | None = None
    # Text calibration: score = 1 / (1 + exp(-(cosine - center) / width)).
    center: float = Field(0.35, ge=-1, le=1)
    width: float = Field(0.05, gt=0, le=1)
    # Per-model thresholds replacing review/block above for that model's score of this label.
    models: dict[ModelName, LabelThresholds] = Field(default_factory=dict)

    def thresholds(self, model: str) -> LabelThresholds:
        return self.models.get(model, self)

    @property
    def prompts(self) -> list[str]:
        return self.clip_prompts or [f"a photo of {d}" for d in self.descriptions]


class PolicySettings(Section):
    models: list[ModelName] = Field(min_length=1)
    labels: dict[str, LabelSettings] = Field(default_factory=dict)
    # Image and caption both present: CLIP consistency below this -> review ("caption_mismatch").
    min_consistency: float | None = Field(None, ge=0, le=1)

    @model_validator(mode="after")
    def _coherent(self) -> PolicySettings:
        if len(set(self.models)) != len(self.models):
            raise ValueError("models must not repeat")
        for name, label in self.labels.items():
            _check_label(name, label, self.models)
        describers = [m for m in self.models if model_package(m).describes]
        if describers and not any(lb.descriptions for lb in self.labels.values()):
            raise ValueError(f"models {sorted(describers)} need at least one label with "
                             "descriptions")
        for owner in model_packages():
            for option in owner.policy_options:
                if getattr(self, option) is not None and owner.name not in self.models:
                    raise ValueError(f"{option} needs the {owner.name} model")
        return self

    @model_validator(mode="before")
    @classmethod
    def _fixed_label_defaults(cls, data: Any) -> Any:
        # A model with fixed labels scores them in every policy that runs it: give them the
        # package's default thresholds unless configured (open_nsfw's nsfw: Yahoo's 0.2/0.8).
        if not isinstance(data, dict):
            return data
        from worker.tasks.moderation.models import MODELS

        labels = dict(data.get("labels") or {})
        for model in data.get("models") or ():
            pkg = MODELS.get(model) if isinstance(model, str) else None
            for label, (review, block) in (pkg.fixed_labels if pkg else {}).items():
                labels.setdefault(label, {"review": review, "block": block})
        return {**data, "labels": labels} if labels else data

    def scorers(self, label: str) -> list[str]:
        """The policy's models that score ``label``."""
        described = bool(self.labels[label].descriptions)
        return [m for m in self.models if model_package(m).scores_label(label, described)]


def _check_label(name: str, label: LabelSettings, models: list[str]) -> None:
    if not LABEL_NAME.fullmatch(name):
        raise ValueError(f"label {name!r} must match {LABEL_NAME.pattern}")
    if any(name in p.info_labels for p in model_packages()):
        raise ValueError(f"label name {name!r} is reserved (a score the models report)")
    if any(not d.strip() for d in label.descriptions):
        raise ValueError(f"label {name!r}: descriptions must not be blank")
    run = [model_package(m) for m in models]
    if label.descriptions and not any(p.describes for p in run):
        readers = ", ".join(p.name for p in model_packages() if p.describes)
        raise ValueError(f"label {name!r} has descriptions but the policy runs no model that "
                         f"reads them ({readers})")
    if not any(p.scores_label(name, bool(label.descriptions)) for p in run):
        fixed = "; ".join(f"{p.name} scores {', '.join(map(repr, p.fixed_labels))}"
                          for p in model_packages() if p.fixed_labels)
        raise ValueError(f"label {name!r}: no model of this policy scores it (give it "
                         f"descriptions, or run a model that scores it: {fixed})")
    for owner in model_packages():
        for option in owner.label_options:
            if getattr(label, option) is not None and owner.name not in models:
                raise ValueError(f"label {name!r} has {option} but the policy does not run "
                                 f"{owner.name}")
    for model in label.models:
        if model not in models:
            raise ValueError(f"label {name!r}: thresholds for {model}, which the policy does "
                             "not run")
        pkg = model_package(model)
        if not pkg.describes and name not in pkg.fixed_labels:
            raise ValueError(f"label {name!r}: {model} scores only "
                             f"{', '.join(map(repr, pkg.fixed_labels))}")
        if name not in pkg.fixed_labels and not label.descriptions:
            raise ValueError(f"label {name!r}: {model} needs descriptions to score it")
