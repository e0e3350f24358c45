"""Kafka settings of the replay, and the look-ups it makes through the worker's one admin
wrapper (:class:`worker.kafka.admin.Admin`).

The replay's consumer never joins a group: it ``assign()``s partitions at explicit offsets,
under a throwaway ``group.id`` (librdkafka wants one) with auto commit and offset store off,
and it never calls commit. So no group's committed offsets, the live one's least of all, move.
Every offset it looks up is as a read_committed reader sees it (the last stable offset).
"""

from __future__ import annotations

from worker.config import WorkerConfig
from worker.exceptions import UnknownTopic as NoSuchTopic
from worker.kafka.admin import Admin
from worker.kafka.admin import admin_settings as admin_settings  # (the replay's admin client)
from worker.kafka.clients import ClientSettings, producer_settings, reader_settings
from worker.tools.replay.exceptions import UnknownTopic


def replay_consumer_settings(cfg: WorkerConfig, replay_id: str) -> ClientSettings:
    # A throwaway group: assign() only, never committed.
    return reader_settings(cfg, f"ktw-replay-{replay_id}")


def replay_producer_settings(cfg: WorkerConfig) -> ClientSettings:
    conf = producer_settings(cfg)
    # Required by the replay's no-duplicate design, whatever producer_extra says.
    conf.update({"enable.idempotence": True, "acks": "all"})
    return conf


def topic_partitions(admin: Admin, topic: str) -> list[int]:
    """The topic's partition ids; the replay's :class:`UnknownTopic` (a bad range: found
    before anything is consumed) if it does not exist."""
    try:
        return admin.partitions(topic)
    except NoSuchTopic as exc:
        raise UnknownTopic(str(exc)) from exc


def topic_ends(admin: Admin, topic: str, partitions: list[int] | None = None
               ) -> dict[int, tuple[int, int]]:
    """(first retained offset, last stable offset) per partition (all when not given)."""
    parts = topic_partitions(admin, topic) if partitions is None else partitions
    return admin.watermarks(topic, parts, committed_only=True)
