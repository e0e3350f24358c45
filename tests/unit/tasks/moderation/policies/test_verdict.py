"""scoring.verdict: nsfw score -> allow / review / block, thresholds inclusive."""

from __future__ import annotations

import numpy as np
import pytest

from worker.config import Thresholds
from worker.tasks.moderation.scoring.verdict import verdict_for
from worker.wire.moderation_jobs import Verdict

DEFAULT = Thresholds()  # review 0.2, block 0.8


@pytest.mark.parametrize(
    ("nsfw", "expected"),
    [
        (0.0, Verdict.ALLOW),
        (0.19999, Verdict.ALLOW),
        (0.2, Verdict.REVIEW),  # == review -> review
        (0.5, Verdict.REVIEW),
        (0.79999, Verdict.REVIEW),
        (0.8, Verdict.BLOCK),  # == block -> block
        (1.0, Verdict.BLOCK),
    ],
)
def test_default_thresholds(nsfw: float, expected: Verdict) -> None:
    assert (DEFAULT.review, DEFAULT.block) == (0.2, 0.8)
    assert verdict_for(nsfw, DEFAULT) is expected


@pytest.mark.parametrize(
    ("nsfw", "expected"),
    [(0.49, Verdict.ALLOW), (0.5, Verdict.BLOCK), (0.51, Verdict.BLOCK)],
)
def test_equal_review_and_block_thresholds_skip_review(nsfw: float, expected: Verdict) -> None:
    assert verdict_for(nsfw, Thresholds(review=0.5, block=0.5)) is expected


def test_zero_review_threshold_reviews_everything_below_block() -> None:
    t = Thresholds(review=0.0, block=0.9)
    assert verdict_for(0.0, t) is Verdict.REVIEW
    assert verdict_for(0.9, t) is Verdict.BLOCK


def test_block_threshold_of_one_blocks_only_certainty() -> None:
    t = Thresholds(review=0.3, block=1.0)
    assert verdict_for(0.999999, t) is Verdict.REVIEW
    assert verdict_for(1.0, t) is Verdict.BLOCK


def test_numpy_float32_scores_compare_like_floats() -> None:
    assert verdict_for(np.float32(0.8), DEFAULT) is Verdict.BLOCK
    assert verdict_for(np.float32(0.1), DEFAULT) is Verdict.ALLOW


# --- a model.policies entry, run as an open_nsfw-only policy, keeps its thresholds' meaning ----

GRID = [0.0, 0.05, 0.1999, 0.2, 0.5, 0.7999, 0.8, 0.95, 1.0]
THRESHOLDS = [Thresholds(), Thresholds(review=0.0, block=0.5), Thresholds(review=0.5, block=0.5),
              Thresholds(review=0.3, block=1.0), Thresholds(review=0.0, block=0.0)]
RULES = {Verdict.BLOCK: "block:open_nsfw.nsfw", Verdict.REVIEW: "review:open_nsfw.nsfw",
         Verdict.ALLOW: "allow"}


@pytest.mark.parametrize("thresholds", THRESHOLDS, ids=repr)
def test_an_open_nsfw_only_policy_decides_as_its_thresholds_say(thresholds: Thresholds) -> None:
    """The moderation task decides every policy with the policy evaluator: a model.policies
    entry (what served_policies makes of it) must keep its thresholds' verdicts, and name the
    rule by open_nsfw's score."""
    from worker.config import load_config
    from worker.tasks.moderation.scoring.policies import evaluate
    from worker.tasks.moderation.served_policies import effective_policies

    cfg = load_config(model={"policies": {"p": thresholds.model_dump()}})
    policy = effective_policies(cfg)["p"]
    for nsfw in GRID:
        decision = evaluate(policy, {"open_nsfw": {"sfw": 1.0 - nsfw, "nsfw": nsfw}})
        verdict = verdict_for(nsfw, thresholds)
        assert (decision.verdict, decision.rule, decision.models_run) == (
            verdict, RULES[verdict], ("open_nsfw",)), nsfw
