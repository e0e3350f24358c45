"""The ``[moderation]`` config section: text and CLIP engines, and image-and-text policies.

A policy names the models it runs (``open_nsfw``, ``text``, ``clip``) and its labels. A label
with ``descriptions`` is scored by the text model (calibrated similarity of the job's text to the
descriptions) and by CLIP (zero-shot probability of the image for the label's prompts); the
label ``nsfw`` is also scored by open_nsfw. Each label has review/block thresholds, optionally
overridden per model, since the models' scores live on different scales. Everything here is
checked at start-up; :mod:`worker.tasks.moderation.scoring.policies` turns scores into a verdict.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from worker.config.base import Section

ModelName = Literal["open_nsfw", "text", "clip"]
LABEL_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# Scores the models report next to the policy's labels, never configurable as labels:
# open_nsfw's sfw, CLIP's probability mass on the neutral prompts, and its image-caption
# consistency.
INFO_LABELS = {"open_nsfw": ("sfw",), "clip": ("neutral", "consistency"), "text": ()}
NSFW = "nsfw"



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

    def thresholds(self, model: ModelName) -> LabelThresholds:
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
        describers = {"text", "clip"} & set(self.models)
        if describers and not any(lb.descriptions for lb in self.labels.values()):
            raise ValueError(f"models {sorted(describers)} need at least one label with "
                             "descriptions")
        if self.min_consistency is not None and "clip" not in self.models:
            raise ValueError("min_consistency needs the clip model")
        return self

    @model_validator(mode="before")
    @classmethod
    def _nsfw_default(cls, data: Any) -> Any:
        # open_nsfw scores exactly one label; give it Yahoo's thresholds unless configured.
        if isinstance(data, dict) and "open_nsfw" in (data.get("models") or ()):
            labels = dict(data.get("labels") or {})
            labels.setdefault(NSFW, {"review": 0.2, "block": 0.8})
            data = {**data, "labels": labels}
        return data

    def scorers(self, label: str) -> list[ModelName]:
        """The policy's models that score ``label``."""
        lb = self.labels[label]
        return [m for m in self.models
                if (m == "open_nsfw" and label == NSFW) or (m != "open_nsfw" and lb.descriptions)]


def _check_label(name: str, label: LabelSettings, models: list[ModelName]) -> None:
    if not LABEL_NAME.fullmatch(name):
        raise ValueError(f"label {name!r} must match {LABEL_NAME.pattern}")
    if any(name in info for info in INFO_LABELS.values()):
        raise ValueError(f"label name {name!r} is reserved (a score the models report)")
    if any(not d.strip() for d in label.descriptions):
        raise ValueError(f"label {name!r}: descriptions must not be blank")
    if label.descriptions and not {"text", "clip"} & set(models):
        raise ValueError(f"label {name!r} has descriptions but the policy runs neither text "
                         "nor clip")
    if not label.descriptions and not (name == NSFW and "open_nsfw" in models):
        raise ValueError(f"label {name!r}: no model of this policy scores it (give it "
                         "descriptions, or run open_nsfw for 'nsfw')")
    if label.clip_prompts is not None and "clip" not in models:
        raise ValueError(f"label {name!r} has clip_prompts but the policy does not run clip")
    for model in label.models:
        if model not in models:
            raise ValueError(f"label {name!r}: thresholds for {model}, which the policy does "
                             "not run")
        if model == "open_nsfw" and name != NSFW:
            raise ValueError(f"label {name!r}: open_nsfw scores only 'nsfw'")
        if model != "open_nsfw" and not label.descriptions:
            raise ValueError(f"label {name!r}: {model} needs descriptions to score it")
