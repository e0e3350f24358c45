"""CLIP zero-shot scores and image-caption consistency.

Zero-shot: the image's unit embedding against every prompt of the policy's labels *and* the
neutral prompts; logits are CLIP's ``logit_scale`` times the cosines, a softmax runs over all
prompts, and a label's score is the probability mass of its prompts. The neutral prompts take
the mass of a harmless image (without them the softmax over the labels alone would hand it to
some label); their mass is reported as ``neutral``. Per image, the scores sum to 1.
Consistency: ``max(0, cos(image, caption))``, the CLIPScore similarity, in [0, 1]; the rule
CLIP adds to policies (:func:`consistency_rule`) sends a job whose consistency is under the
policy's ``min_consistency`` to review.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from worker.config.policies import PolicySettings
from worker.tasks.moderation.models.package import RuleHit
from worker.wire.moderation_jobs import Verdict

NEUTRAL = "neutral"


@dataclass(frozen=True)
class PromptBank:
    labels: tuple[str, ...]  # the policy's CLIP labels, then "neutral"
    vectors: np.ndarray  # [prompts, dim] unit rows, grouped by label in ``labels`` order
    starts: np.ndarray  # first prompt of each label
    logit_scale: float

    def probabilities(self, images: np.ndarray) -> np.ndarray:
        """[images, labels]: softmax over all prompts, summed per label."""
        logits = self.logit_scale * (images.astype(np.float64) @ self.vectors.T)
        logits -= logits.max(axis=1, keepdims=True)  # exp never overflows
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return np.asarray(np.add.reduceat(p, self.starts, axis=1))

    def scores(self, image: np.ndarray, caption: np.ndarray | None) -> dict[str, float]:
        probs = self.probabilities(image[None])[0]
        out = {label: float(p) for label, p in zip(self.labels, probs, strict=True)}
        if caption is not None:
            out["consistency"] = consistency(image, caption)
        return out


def consistency(image: np.ndarray, caption: np.ndarray) -> float:
    return float(min(1.0, max(0.0, float(np.dot(image, caption)))))


def consistency_rule(policy: PolicySettings, scores: Mapping[str, float]) -> RuleHit | None:
    """``review:clip.consistency``: the policy sets ``min_consistency``, CLIP compared the image
    with its caption, and the consistency is below it (an image that does not show what its
    text says is worth a human look)."""
    value = scores.get("consistency")
    if policy.min_consistency is None or value is None or value >= policy.min_consistency:
        return None
    return RuleHit(Verdict.REVIEW, "review:clip.consistency",
                   f"clip.consistency {value:.3f} < min_consistency "
                   f"{policy.min_consistency:.3f}")


def prompt_bank(policy: PolicySettings, neutral: list[str], logit_scale: float,
                embed: Callable[[list[str]], np.ndarray]) -> PromptBank:
    groups = [(name, lb.prompts) for name, lb in policy.labels.items() if lb.descriptions]
    groups.append((NEUTRAL, neutral))
    counts = [len(p) for _, p in groups]
    return PromptBank(labels=tuple(name for name, _ in groups),
                      vectors=embed([p for _, ps in groups for p in ps]),
                      starts=np.cumsum([0, *counts[:-1]]), logit_scale=logit_scale)
