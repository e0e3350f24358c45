"""Scores -> allow / review / block under an image-and-text policy, and which rule decided.

Rules, in order; the first that matches decides:
1. ``block:<model>.<label>``: some model's score of a label is at or above that label's block
   threshold for that model. With several, the one furthest above its threshold is named.
2. ``review:<model>.<label>``: likewise for review thresholds.
3. the rules the models that ran add, in the policy's model order (each model package's
   ``ModelPackage.rules``; CLIP's ``review:clip.consistency``: the image does not show what its
   caption says, :func:`worker.tasks.moderation.models.clip.scoring.consistency_rule`).
4. ``allow``: nothing above reached a threshold.
Every score the models produced is in ``label_scores`` as ``<model>.<label>``, including the
informational ones (each package's ``info_labels``: open_nsfw's sfw, CLIP's neutral mass and
consistency).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from worker.config.policies import PolicySettings
from worker.tasks.moderation.models import package
from worker.wire.moderation_jobs import Verdict

# By model name (a plug-in's, worker.tasks.moderation.models): its scores by label.
ScoresByModel = Mapping[str, Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    rule: str  # machine-readable: "block:text.violence", "allow", ...
    reason: str  # for people: "text.violence 0.931 >= block 0.900"
    label_scores: dict[str, float]
    models_run: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Hit:
    key: str
    score: float
    threshold: float

    @property
    def margin(self) -> float:
        return self.score - self.threshold


def evaluate(policy: PolicySettings, scores_by_model: ScoresByModel) -> Decision:
    """Apply the rules above. ``scores_by_model`` holds only the models that ran."""
    if not scores_by_model:
        raise ValueError("no model produced scores: nothing to decide on")
    models_run = tuple(m for m in policy.models if m in scores_by_model)
    stray = set(scores_by_model) - set(policy.models)
    if stray:
        raise ValueError(f"scores from models {sorted(stray)} that the policy does not run")
    flat: dict[str, float] = {}
    blocks: list[_Hit] = []
    reviews: list[_Hit] = []
    for model in models_run:
        scores = scores_by_model[model]
        for label, score in scores.items():
            _check_score(model, label, score, policy)
            key = f"{model}.{label}"
            flat[key] = float(score)
            if label in _info_labels(model):
                continue
            t = policy.labels[label].thresholds(model)
            if score >= t.block:
                blocks.append(_Hit(key, score, t.block))
            elif score >= t.review:
                reviews.append(_Hit(key, score, t.review))
    if blocks:
        return _decide(Verdict.BLOCK, "block", blocks, flat, models_run)
    if reviews:
        return _decide(Verdict.REVIEW, "review", reviews, flat, models_run)
    for model in models_run:
        for rule in package(model).rule_functions():
            hit = rule(policy, scores_by_model[model])
            if hit is not None:
                return Decision(hit.verdict, hit.rule, hit.reason, flat, models_run)
    return Decision(Verdict.ALLOW, "allow", "no score reached its review threshold", flat,
                    models_run)


def _decide(verdict: Verdict, kind: str, hits: list[_Hit], flat: dict[str, float],
            models_run: tuple[str, ...]) -> Decision:
    top = max(hits, key=lambda h: h.margin)  # max() keeps the first of equal margins
    reason = f"{top.key} {top.score:.3f} >= {kind} {top.threshold:.3f}"
    return Decision(verdict, f"{kind}:{top.key}", reason, flat, models_run)


def _info_labels(model: str) -> tuple[str, ...]:
    """The scores ``model`` reports that are no policy label."""
    return package(model).info_labels


def _check_score(model: str, label: str, score: float, policy: PolicySettings) -> None:
    # A bad score here is a bug in a scorer, never a property of the job: fail loudly.
    if label not in _info_labels(model) and (
            label not in policy.labels or model not in policy.scorers(label)):
        raise ValueError(f"{model} scored {label!r}, which the policy does not ask it to score")
    if not (math.isfinite(score) and 0.0 <= score <= 1.0):
        raise ValueError(f"{model}.{label} = {score!r} is not a score in [0, 1]")
