"""worker.tasks.gpu_share.GpuShare: claims held by one task's batches make the yielding task's
steps wait, bounded; threads, no GPU."""

from __future__ import annotations

import threading
import time
from typing import Literal

import pytest

from worker.tasks.gpu_share import GpuShare


def test_no_claim_no_wait() -> None:
    share = GpuShare(max_wait_s=5.0)
    t = time.monotonic()
    assert share.yield_turn() == 0.0
    assert time.monotonic() - t < 0.1 and share.yields == 0


def test_a_step_waits_until_the_claimed_batch_finishes() -> None:
    share = GpuShare(max_wait_s=5.0)
    release = share.claim()
    threading.Timer(0.1, release).start()
    t = time.monotonic()
    waited = share.yield_turn()
    took = time.monotonic() - t
    assert 0.05 < took < 2.0 and 0.05 < waited < 2.0
    assert share.claims == 0 and share.yields == 1


def test_the_wait_is_bounded_while_claims_keep_coming() -> None:
    share = GpuShare(max_wait_s=0.05)
    share.claim()  # never released: a steady stream of batches
    t = time.monotonic()
    share.yield_turn()
    assert 0.04 < time.monotonic() - t < 1.0


def test_a_step_waits_for_every_claim() -> None:
    share = GpuShare(max_wait_s=5.0)
    first, second = share.claim(), share.claim()
    threading.Timer(0.05, first).start()
    threading.Timer(0.2, second).start()
    t = time.monotonic()
    share.yield_turn()
    assert time.monotonic() - t > 0.15


def test_release_counts_once() -> None:
    share = GpuShare(max_wait_s=5.0)
    release = share.claim()
    share.claim()
    release()
    release()
    assert share.claims == 1


def test_zero_max_wait_never_waits() -> None:
    share = GpuShare(max_wait_s=0.0)
    share.claim()
    t = time.monotonic()
    assert share.yield_turn() == 0.0
    assert time.monotonic() - t < 0.05


def test_a_turn_may_bound_its_own_wait() -> None:
    share = GpuShare(max_wait_s=0.0)
    share.claim()  # never released
    waited = share.yield_turn(0.05)
    assert 0.04 <= waited < 1.0, "waited its own bound, not the share's zero"
    assert share.yields == 1
    assert share.yield_turn() == 0.0, "the share's own bound again"


@pytest.mark.parametrize(("priority", "left_free", "urgent"),
                         [("auto", 0, True), ("auto", 16, False), (True, 16, True),
                          (False, 0, False)])
def test_auto_priority_only_where_no_sms_were_left_free(
        priority: bool | Literal["auto"], left_free: int, urgent: bool) -> None:
    share = GpuShare(max_wait_s=0.0, free_sms=16, priority=priority)
    share.left_free = left_free
    assert share.urgent is urgent
