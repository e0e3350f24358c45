"""SM partitions: their size rule (the green contexts themselves: tests/gpu)."""

from __future__ import annotations

import pytest

from engines.exceptions import EngineError
from engines.gpu_partition import SmPartition, device_sms, partition_size, rest_of


def test_a_partition_leaves_at_least_the_asked_sms_in_whole_groups() -> None:
    assert partition_size(132, 8, 0) == 132  # nothing asked: the whole device
    assert partition_size(132, 8, 12) == 120
    assert partition_size(132, 8, 16) == 112  # 116 is not a whole number of groups
    assert partition_size(132, 8, 4) == 128
    assert partition_size(132, 8, 124) == 8


def test_leaving_too_many_sms_free_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="leaves no group of 8"):
        partition_size(132, 8, 125)


def test_without_a_cuda_driver_the_partition_fails_as_an_engine_error() -> None:
    try:
        total, _ = device_sms(0)
    except EngineError as exc:  # the driver's own error, wrapped (or no bindings at all)
        assert any(m in str(exc) for m in ("CUDA driver error", "no CUDA driver",
                                           "do not import"))
        return
    pytest.skip(f"a CUDA device with {total} SMs is present (tests/gpu covers partitions)")


def test_a_partition_without_a_rest_has_no_free_sms_to_run_on() -> None:
    """The whole device (nothing left free), or a rest itself: an engine error, which the
    runners and the pipeline turn into a warning and every SM."""
    with pytest.raises(EngineError, match="leaves none"):
        rest_of(SmPartition(device=0, sms=132, total=132, ctx=None))
