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

import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from worker.config.policies import LabelThresholds, PolicySettings
from worker.tasks.moderation.models import package
from worker.tasks.moderation.models.package import Rule
from worker.wire.moderation_jobs import Verdict

# By model name (a plug-in's, worker.tasks.moderation.models): its scores by label.
ScoresByModel = Mapping[str, Mapping[str, float]]


# Not frozen: one is made per job, and a frozen dataclass's __init__ (object.__setattr__ per
# field) costs four times a plain one's. Nothing changes a Decision once made.
@dataclass(slots=True)
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


@dataclass(frozen=True, slots=True)
class _ModelRules:
    """What one model's scores mean under one policy: its informational labels, the
    thresholds of the labels the policy has it score, and its package's extra rules."""

    info: frozenset[str]
    thresholds: Mapping[str, LabelThresholds]
    rules: tuple[Rule, ...]
    keys: Mapping[str, str]  # label -> "<model>.<label>", for the labels above


@dataclass(frozen=True, slots=True)
class _PolicyRules:
    models: tuple[str, ...]  # the policy's models, in its order
    model_set: frozenset[str]
    by_model: Mapping[str, _ModelRules]


# Per policy, worked out on first use: every job's result is decided here, and the policy's
# lookups (which models score a label, its thresholds for a model, the package's info labels)
# cost more than the comparisons. Keyed by the policy object's id, checked against a weak
# reference and dropped with the policy (configs are frozen: a policy never changes; a test's
# new config is a new object).
_RULES: dict[int, tuple[weakref.ref[PolicySettings], _PolicyRules]] = {}


def _model_rules(policy: PolicySettings, model: str) -> _ModelRules:
    pkg = package(model)
    info = frozenset(pkg.info_labels)
    thresholds = {label: settings.thresholds(model)
                  for label, settings in policy.labels.items()
                  if label not in info and model in policy.scorers(label)}
    return _ModelRules(info, thresholds, tuple(pkg.rule_functions()),
                       {label: f"{model}.{label}" for label in (*info, *thresholds)})


def _rules(policy: PolicySettings) -> _PolicyRules:
    key = id(policy)
    hit = _RULES.get(key)
    if hit is not None and hit[0]() is policy:
        return hit[1]
    models = tuple(policy.models)
    rules = _PolicyRules(models, frozenset(models),
                         {model: _model_rules(policy, model) for model in models})
    _RULES[key] = (weakref.ref(policy, lambda _ref: _RULES.pop(key, None)), rules)
    return rules


def evaluate(policy: PolicySettings, scores_by_model: ScoresByModel, *,
             qualified: bool = True) -> Decision:
    """Apply the rules above. ``scores_by_model`` holds only the models that ran.
    ``qualified=False``: ``label_scores`` and the rule name labels without their model (one
    model's scores, as a v1 open_nsfw result has them)."""
    if not scores_by_model:
        raise ValueError("no model produced scores: nothing to decide on")
    plan = _rules(policy)
    models_run = plan.models
    if scores_by_model.keys() != plan.model_set:  # not every model ran (a subset scored)
        stray = set(scores_by_model) - plan.model_set
        if stray:
            raise ValueError(f"scores from models {sorted(stray)} that the policy does not run")
        models_run = tuple(m for m in plan.models if m in scores_by_model)
    flat: dict[str, float] = {}
    blocks: list[_Hit] | None = None  # made when the first score reaches its threshold
    reviews: list[_Hit] | None = None
    by_model = plan.by_model
    for model in models_run:
        rules = by_model[model]
        thresholds, keys = rules.thresholds, rules.keys
        for label, score in scores_by_model[model].items():
            # A bad score here is a bug in a scorer, never a property of the job: fail loudly.
            t = thresholds.get(label)
            if t is None and label not in rules.info:
                raise ValueError(f"{model} scored {label!r}, which the policy does not ask it "
                                 "to score")
            if not 0.0 <= score <= 1.0:  # NaN fails both comparisons, infinities one
                raise ValueError(f"{model}.{label} = {score!r} is not a score in [0, 1]")
            key = keys[label] if qualified else label
            flat[key] = float(score)
            if t is None:  # informational
                continue
            if score >= t.block:
                blocks = blocks if blocks is not None else []
                blocks.append(_Hit(key, score, t.block))
            elif score >= t.review:
                reviews = reviews if reviews is not None else []
                reviews.append(_Hit(key, score, t.review))
    if blocks:
        return _decide(Verdict.BLOCK, "block", blocks, flat, models_run)
    if reviews:
        return _decide(Verdict.REVIEW, "review", reviews, flat, models_run)
    for model in models_run:
        for rule in by_model[model].rules:
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
