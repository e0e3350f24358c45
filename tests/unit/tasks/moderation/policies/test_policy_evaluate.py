"""scoring.policies.evaluate: the allow / review / block rules and what a decision records."""

from __future__ import annotations

from typing import Any

import pytest

from worker.config.policies import PolicySettings
from worker.tasks.moderation.scoring.policies import evaluate
from worker.wire.moderation_jobs import Verdict

POLICY = PolicySettings(
    models=["open_nsfw", "text", "clip"], min_consistency=0.2,
    labels={
        "violence": {"descriptions": ["violence"], "review": 0.5, "block": 0.9,
                     "models": {"clip": {"review": 0.3, "block": 0.6}}},
        "scam": {"descriptions": ["scam"], "review": 0.6, "block": 0.95},
    })
CALM: dict[str, Any] = {
    "open_nsfw": {"sfw": 0.99, "nsfw": 0.01},
    "text": {"violence": 0.1, "scam": 0.1},
    "clip": {"violence": 0.05, "scam": 0.05, "neutral": 0.9, "consistency": 0.3},
}


def _with(**changes: dict[str, float]) -> dict[str, Any]:
    return {m: {**s, **changes.get(m, {})} for m, s in CALM.items()}


def test_allow_when_nothing_reaches_review() -> None:
    d = evaluate(POLICY, CALM)
    assert (d.verdict, d.rule) == (Verdict.ALLOW, "allow")
    assert d.models_run == ("open_nsfw", "text", "clip")
    assert d.label_scores == {"open_nsfw.sfw": 0.99, "open_nsfw.nsfw": 0.01,
                              "text.violence": 0.1, "text.scam": 0.1, "clip.violence": 0.05,
                              "clip.scam": 0.05, "clip.neutral": 0.9, "clip.consistency": 0.3}


@pytest.mark.parametrize(("scores", "verdict", "rule"), [
    (_with(text={"violence": 0.5}), Verdict.REVIEW, "review:text.violence"),  # at threshold
    (_with(text={"violence": 0.49}), Verdict.ALLOW, "allow"),
    (_with(text={"violence": 0.9}), Verdict.BLOCK, "block:text.violence"),
    (_with(open_nsfw={"nsfw": 0.8}), Verdict.BLOCK, "block:open_nsfw.nsfw"),  # Yahoo defaults
    (_with(open_nsfw={"nsfw": 0.2}), Verdict.REVIEW, "review:open_nsfw.nsfw"),
    (_with(clip={"violence": 0.3}), Verdict.REVIEW, "review:clip.violence"),  # per-model
    (_with(clip={"violence": 0.6}), Verdict.BLOCK, "block:clip.violence"),
    (_with(clip={"consistency": 0.1}), Verdict.REVIEW, "review:clip.consistency"),
])
def test_single_rules(scores: dict[str, Any], verdict: Verdict, rule: str) -> None:
    d = evaluate(POLICY, scores)
    assert (d.verdict, d.rule) == (verdict, rule)


def test_block_beats_review_and_the_widest_margin_is_named() -> None:
    d = evaluate(POLICY, _with(text={"violence": 0.95, "scam": 0.99},
                               clip={"violence": 0.45, "consistency": 0.0}))
    assert d.verdict is Verdict.BLOCK
    # violence is 0.05 over its block threshold, scam only 0.04: violence is named
    assert d.rule == "block:text.violence"
    assert d.reason == "text.violence 0.950 >= block 0.900"


def test_label_review_is_named_before_caption_mismatch() -> None:
    d = evaluate(POLICY, _with(text={"scam": 0.7}, clip={"consistency": 0.0}))
    assert d.rule == "review:text.scam"


def test_equal_margins_name_the_first_in_policy_order() -> None:
    even = PolicySettings(models=["open_nsfw", "text"], labels={
        "nsfw": {"review": 0.25, "block": 0.5},
        "violence": {"descriptions": ["violence"], "review": 0.25, "block": 0.5}})
    d = evaluate(even, {"text": {"violence": 0.75}, "open_nsfw": {"nsfw": 0.75, "sfw": 0.25}})
    assert d.rule == "block:open_nsfw.nsfw"


def test_only_models_that_ran_are_listed() -> None:
    d = evaluate(POLICY, {"text": {"violence": 0.2, "scam": 0.0}})
    assert d.models_run == ("text",) and set(d.label_scores) == {"text.violence", "text.scam"}
    assert d.verdict is Verdict.ALLOW


def test_consistency_rule_needs_the_policy_setting() -> None:
    lax = POLICY.model_copy(update={"min_consistency": None})
    assert evaluate(lax, _with(clip={"consistency": 0.0})).verdict is Verdict.ALLOW


@pytest.mark.parametrize(("scores", "message"), [
    ({}, "no model produced scores"),
    ({"text": {"nsfw": 0.1}}, "does not ask it to score"),
    ({"open_nsfw": {"violence": 0.1}}, "does not ask it to score"),
    ({"text": {"violence": 1.5}}, r"not a score in \[0, 1\]"),
    ({"text": {"violence": float("nan")}}, "not a score"),
    ({"text": {"violence": float("inf")}}, "not a score"),
    ({"text": {"violence": float("-inf")}}, "not a score"),
    ({"text": {"violence": -0.01}}, "not a score"),
])
def test_scorer_bugs_fail_loudly(scores: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(POLICY, scores)


def test_scores_from_a_model_the_policy_does_not_run() -> None:
    text_only = PolicySettings(models=["text"], labels={"scam": {"descriptions": ["scam"]}})
    with pytest.raises(ValueError, match="does not run"):
        evaluate(text_only, {"text": {"scam": 0.1}, "clip": {"scam": 0.1}})
