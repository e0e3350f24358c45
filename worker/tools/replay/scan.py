"""Resume without duplicates: find what an interrupted run wrote after its last checkpoint.

Every output record of a replay carries ``ktw.replay.id`` and its source partition and offset.
A checkpoint saves, per output partition, ``scan_from``: one past the highest offset whose
delivery the run had seen acknowledged. The idempotent producer appends each partition's
records in the order they were produced, so anything the run had produced but not yet seen
acknowledged (or produced later) sits at or after ``scan_from``. Reading each output partition
from ``scan_from`` to its end therefore finds every record written since the checkpoint, and
those source offsets are marked handled instead of being produced again. This holds after a
``kill -9`` at any point, because it trusts only what is on the broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import confluent_kafka as ck

from worker.exceptions import JobRejected
from worker.kafka.admin import Admin
from worker.kafka.headers import read_headers
from worker.kafka.reader import read_ranges
from worker.tools.replay.headers import parse_written
from worker.tools.replay.kafka import topic_ends
from worker.tools.replay.state import ReplayState
from worker.wire.moderation_codec import decode_result


def output_ends(admin: Admin, topic: str) -> dict[int, int]:
    return {p: high for p, (_low, high) in topic_ends(admin, topic).items()}


def recover_written(admin: Admin, consumer_conf: Mapping[str, Any], state: ReplayState
                    ) -> int:
    """Mark as handled every source record the replay's outputs already answer; return how
    many were found that the state file did not know about. Moves ``scan_from`` to the ends."""
    found = 0

    def on_message(msg: ck.Message) -> None:
        nonlocal found
        w = parse_written(read_headers(msg)[0])  # unreadable: not the replay's output
        if w is None or w.replay_id != state.replay_id:
            return
        ledger = state.partitions.get(w.partition)
        if ledger is None or not ledger.start <= w.offset < ledger.end:
            return
        if ledger.is_done(w.offset):
            return
        ledger.handle(w.offset, _kind(msg, w.reason))
        found += 1

    for topic, starts in state.scan_from.items():
        ends = output_ends(admin, topic)
        ranges = {p: (starts.get(p, 0), end) for p, end in ends.items()}
        read_ranges(consumer_conf, topic, ranges, on_message)
        state.scan_from[topic] = dict(ends)
    for ledger in state.partitions.values():
        ledger.advance(None)
    return found


def _kind(msg: ck.Message, dlq_reason: str | None) -> str:
    if dlq_reason is not None:
        return f"dlq:{dlq_reason}"
    try:
        status = decode_result(msg.value() or b"").get("status", "unknown")
    except JobRejected:
        status = "unknown"
    return f"result:{status}"
