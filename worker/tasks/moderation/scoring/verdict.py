"""Scores -> verdict under a policy's thresholds."""

from __future__ import annotations

from worker.config import Thresholds
from worker.wire.moderation_jobs import Verdict

# An open_nsfw-only verdict as the rule an image-and-text policy running open_nsfw alone names
# (worker.tasks.moderation.scoring.policies): verdict_for reads open_nsfw's nsfw score and
# nothing else, so block and review are always decided by it.
OPEN_NSFW_RULES = {Verdict.BLOCK: "block:open_nsfw.nsfw", Verdict.REVIEW: "review:open_nsfw.nsfw",
                   Verdict.ALLOW: "allow"}


def verdict_for(nsfw: float, thresholds: Thresholds) -> Verdict:
    """block at or above ``block``, review at or above ``review``, else allow."""
    if nsfw >= thresholds.block:
        return Verdict.BLOCK
    if nsfw >= thresholds.review:
        return Verdict.REVIEW
    return Verdict.ALLOW
