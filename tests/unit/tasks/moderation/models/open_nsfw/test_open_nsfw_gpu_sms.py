"""open_nsfw's GPU model kept to the SMs generation leaves free (processing.gpu_disjoint_sms)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from structlog.testing import capture_logs

from engines.exceptions import RunnerStateError
from worker.tasks.moderation.models.open_nsfw.gpu import OpenNsfwGpuModel


class _Runner:
    def __init__(self, *, active: bool = False) -> None:
        self.active, self.asked = active, []

    def use_free_sms(self, sms: int) -> bool:
        if self.active:
            raise RunnerStateError("SMs are partitioned before activation")
        self.asked.append(sms)
        return True


def _model(runner: _Runner, *, streams: bool = False) -> OpenNsfwGpuModel:
    # Only what use_free_sms touches: the pipeline (streams made or not) and the runner.
    model = OpenNsfwGpuModel.__new__(OpenNsfwGpuModel)
    model.runner = runner  # type: ignore[assignment]
    model.pipeline = SimpleNamespace(h2d=object() if streams else None,  # type: ignore[assignment]
                                     on_free_sms=0)
    return model


def test_its_pipeline_and_its_runner_keep_to_the_free_sms() -> None:
    runner = _Runner()
    model = _model(runner)
    assert model.use_free_sms(16)
    assert model.pipeline.on_free_sms == 16 and runner.asked == [16]


def test_a_shared_runner_already_active_leaves_the_pipeline_kept_there() -> None:
    model = _model(_Runner(active=True))
    with capture_logs() as logs:
        assert model.use_free_sms(16)
    assert model.pipeline.on_free_sms == 16
    assert [e["event"] for e in logs] == ["gpu_free_sms_ignored"]


@pytest.mark.parametrize("sms", [16, 32])
def test_a_pipeline_with_its_streams_made_stays_where_it_is(sms: int) -> None:
    runner = _Runner()
    model = _model(runner, streams=True)
    with capture_logs() as logs:
        assert not model.use_free_sms(sms)
    assert model.pipeline.on_free_sms == 0 and runner.asked == []
    assert "streams exist" in logs[0]["reason"]
