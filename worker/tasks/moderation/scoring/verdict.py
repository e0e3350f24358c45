"""Scores -> verdict under a policy's thresholds."""

from __future__ import annotations

from worker.config import Thresholds
from worker.wire.moderation_jobs import Verdict


def verdict_for(nsfw: float, thresholds: Thresholds) -> Verdict:
    """block at or above ``block``, review at or above ``review``, else allow."""
    if nsfw >= thresholds.block:
        return Verdict.BLOCK
    if nsfw >= thresholds.review:
        return Verdict.REVIEW
    return Verdict.ALLOW
