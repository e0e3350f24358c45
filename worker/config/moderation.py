"""The ``[moderation]`` config section: image decoding budgets, the policies by name, and one
section per model package that has settings (``moderation.<model>``).

A model's section belongs to its package (:mod:`worker.tasks.moderation.models`): its record
names a :class:`ModelSection` subclass, and this section validates ``moderation.<model>``
against it (defaults when absent) and refuses keys that are neither its own fields nor a
registered model's section. Cross-section rules live here, checked at start-up: a policy that
runs a model whose section cannot serve it is refused (CLIP without ``weights_dir``: no CLIP
weights ship with the worker). Whether a model's packages are installed is checked where the
engines are made (:mod:`worker.tasks.moderation.served_policies`), so this validation never
depends on what is installed.
"""

from __future__ import annotations

import contextlib
import json
import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from worker.config.base import Section
from worker.config.names import model_packages
from worker.config.policies import PolicySettings
from worker.wire.moderation_codec import POLICY_NAME


class ModelSection(Section):
    """A model package's config section, ``moderation.<model>``."""

    def unserved(self) -> str | None:
        """Why a policy that runs the model cannot be served with these settings (a missing
        weights folder, say), or None. Checked for every policy at config load."""
        return None


SectionT = TypeVar("SectionT", bound=ModelSection)


def increasing(name: str, values: list[int], *, hi: int) -> None:
    """Refuse (ValueError) ``values`` unless strictly increasing within 1..hi."""
    if not values or values != sorted(set(values)) or values[0] < 1 or values[-1] > hi:
        raise ValueError(f"{name} must be strictly increasing, within 1..{hi}")


# Decoded pixels every thread decoding images in one process may hold at once
# (worker/tasks/moderation/images/budgets.py). At least the largest still image the default
# limits admit (limits.max_image_pixels, 40M), so no such image is refused by default; a job
# whose decode needs more than the whole budget is refused. Measured with decode_views on the
# 2-core VM: a 40M-pixel RGB JPEG peaked at 7 bytes a pixel (0.27 GB), an RGBA PNG with alpha
# (two views) at 20: 64M pixels bound decoding to roughly 0.45-1.3 GB whatever decode_threads
# is, where 2 threads on two such images could take 1.5 GB before and 16 threads 12 GB.
DECODE_PIXEL_BUDGET = 64_000_000
# Per job, from the moment it holds its pixels: the largest images the limits admit took 1.1 s
# (40M-pixel progressive JPEG) and 2.3 s (40M-pixel RGBA PNG) alone on the 2-core VM; 10 s
# leaves room for a loaded machine. A backstop for what the header counts miss (see budgets.py
# for what it can and cannot stop), not the first defence.
DECODE_TIME_LIMIT_S = 10.0


def _is_complex(annotation: Any) -> bool:
    """A list, dict, set, tuple or model (also inside ``X | None``)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_complex(a) for a in typing.get_args(annotation))
    if origin in (list, dict, set, frozenset, tuple) or annotation in (list, dict, set, tuple):
        return True
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _env_decoded(cls: type[ModelSection], value: Any) -> Any:
    """A model section as the environment gives it, JSON decoded where pydantic-settings did
    not: it decodes complex values only for fields it knows, and a model section is an extra
    key, so ``KTW_MODERATION__TEXT__BATCH_SIZES='[1, 8]'`` and ``KTW_MODERATION__TINY='{...}'``
    arrive as strings."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value  # refused by validation, with the field named
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for key, raw in value.items():
        field = cls.model_fields.get(key)
        if isinstance(raw, str) and field is not None and _is_complex(field.annotation):
            with contextlib.suppress(ValueError):  # else refused by validation, field named
                out[key] = json.loads(raw)
    return out


class ModerationSettings(Section):
    # The model sections are extra keys, each validated by its package's settings class.
    model_config = ConfigDict(frozen=True, extra="allow", hide_input_in_errors=True)

    decode_pixel_budget: int = Field(DECODE_PIXEL_BUDGET, ge=1_000_000)
    decode_time_limit_s: float = Field(DECODE_TIME_LIMIT_S, gt=0, le=600)
    # Image-and-text policies by name; a name here replaces the same name in model.policies.
    policies: dict[str, PolicySettings] = Field(default_factory=dict)
    # CPU open_nsfw: libjpeg decodes a JPEG at 1/2, 1/4 or 1/8 size (never below the 256 resize)
    # before the resize: a 1080p frame's decode + resize ~4x faster, but scores move (up to
    # 0.047 on real 720p/1080p frames, bench/NOTES.md "DCT scaling"), so it is opt-in.
    jpeg_dct_scaling: bool = False

    @model_validator(mode="before")
    @classmethod
    def _model_sections(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        classes = {p.name: c for p in model_packages() if (c := p.settings_class()) is not None}
        unknown = sorted(set(data) - set(cls.model_fields) - set(classes))
        if unknown:
            raise ValueError(f"unknown keys {unknown} (model sections: "
                             f"{', '.join(classes) or 'none'})")
        sections: dict[str, ModelSection] = {}
        for name, c in classes.items():
            value = data.get(name, {})
            try:
                sections[name] = value if isinstance(value, c) else c.model_validate(
                    _env_decoded(c, value))
            except ValidationError as exc:
                # Raised as this section's error, or the message would name the inner field
                # as if it were moderation's own (moderation.batch_sizes for text's).
                raise ValueError("; ".join(
                    f"{'.'.join(map(str, (name, *e['loc'])))}: {e['msg']}" for e in exc.errors()
                )) from None
        return {**data, **sections}

    @model_validator(mode="after")
    def _resolvable(self) -> ModerationSettings:
        for name, policy in self.policies.items():
            if not POLICY_NAME.fullmatch(name):
                raise ValueError(f"policy name {name!r} can never be named by a job "
                                 f"(pattern {POLICY_NAME.pattern})")
            for model in policy.models:
                section = self.sections.get(model)
                problem = section.unserved() if section is not None else None
                if problem is not None:
                    raise ValueError(f"policy {name!r} uses {model} but {problem}")
        return self

    @property
    def sections(self) -> dict[str, ModelSection]:
        """The model sections, by model name."""
        return {k: v for k, v in (self.__pydantic_extra__ or {}).items()
                if isinstance(v, ModelSection)}

    def section(self, model: str, cls: type[SectionT]) -> SectionT:
        """``moderation.<model>``, as its package's settings class ``cls``."""
        found = self.sections.get(model)
        if not isinstance(found, cls):
            raise KeyError(f"no moderation.{model} section of type {cls.__name__} (is the "
                           f"model registered?)")
        return found
