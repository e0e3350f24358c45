"""processing.task naming several tasks, and worker.config.tasks.per_task: a config per task,
each in its own consumer group (and so with its own transactional id)."""

from __future__ import annotations

import pytest

from worker.config import load_config
from worker.config.tasks import group_id_of, per_task
from worker.exceptions import ConfigError
from worker.kafka.clients import transactional_id
from worker.tasks.registry import engine_plans, task_topics


def test_one_task_is_served_as_before() -> None:
    cfg = load_config(None)
    assert cfg.processing.tasks == ("moderation",)
    assert per_task(cfg) == {"moderation": cfg}


@pytest.mark.parametrize("given", ["moderation,generation", " moderation , generation",
                                   ["moderation", "generation"]])
def test_several_tasks_comma_separated_or_as_a_list(given: object) -> None:
    cfg = load_config(None, processing={"task": given})
    assert cfg.processing.task == "moderation,generation"
    assert cfg.processing.tasks == ("moderation", "generation")


@pytest.mark.parametrize(("given", "says"), [
    ("moderation,drawing", "unknown task 'drawing'"),
    ("moderation,moderation", "names moderation twice"),
    ("moderation,", "an empty name"),
])
def test_names_are_checked_against_the_registry(given: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(None, processing={"task": given})


def test_each_task_gets_its_own_group_and_transactional_id() -> None:
    cfg = load_config(None, kafka={"group_id": "g", "instance_id": "pod-0"},
                      processing={"task": "moderation,generation",
                                  "guarantee": "exactly-once"})
    configs = per_task(cfg)
    assert list(configs) == ["moderation", "generation"]
    assert configs["moderation"].processing.task == "moderation"
    assert configs["generation"].processing.task == "generation"
    assert configs["moderation"].kafka.group_id == "g"
    assert configs["generation"].kafka.group_id == "g-generation"
    assert transactional_id(configs["moderation"]) == "ktw.g.pod-0"
    assert transactional_id(configs["generation"]) == "ktw.g-generation.pod-0"
    assert task_topics(configs["generation"]).jobs == cfg.generation.topics.jobs


def test_the_first_task_named_keeps_the_group_id() -> None:
    cfg = load_config(None, kafka={"group_id": "g"},
                      processing={"task": "generation,moderation"})
    assert group_id_of(cfg, "generation") == "g"
    assert group_id_of(cfg, "moderation") == "g-moderation"


def test_tools_that_work_on_one_task_refuse_several() -> None:
    cfg = load_config(None, processing={"task": "moderation,generation"})
    with pytest.raises(ConfigError, match="names several tasks"):
        task_topics(cfg)
    with pytest.raises(ConfigError, match="name it with --task"):
        engine_plans(cfg)
