"""``dlq redrive``: re-send dead-lettered jobs to the jobs topic, at most once per DLQ record.

Progress is the redrive group's committed offsets on the DLQ (``<kafka.group_id>.redrive`` by
default), committed only after every job re-sent before it was acknowledged: a run that
stops early, or a second run, goes on from there and re-sends nothing twice. What a run passes
over stays behind the group's cursor, so:

- records not matching ``--reason`` / ``--since`` are passed over (counted; another
  ``--group`` scans them again);
- ``--until`` and ``--limit`` end the scan instead: the records after it stay for a later run;
- a matching record that cannot be re-sent (a by-reference job no longer retained, say) is
  reported and counted as skipped, never dropped silently.

Two redrives of one group must not run at once (the group has no members to exclude another).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import confluent_kafka as ck

from worker.config import WorkerConfig
from worker.kafka.admin import Admin
from worker.tools.admin.common import default_redrive_group, task_topics
from worker.tools.admin.deadletters import Filter, check_fetched, inspect, redriven_headers
from worker.tools.admin.errors import BadOption
from worker.tools.admin.fetch import SourceFetcher
from worker.tools.admin.redrive_kafka import (
    DlqReader,
    Sender,
    header_list,
    scan_start,
    timestamp_ms,
)
from worker.tools.admin.redrive_summary import RedriveSummary


@dataclass(frozen=True, slots=True)
class RedriveRequest:
    filter: Filter = field(default_factory=Filter)
    limit: int | None = None  # re-send at most this many jobs this run
    dry_run: bool = False
    to_topic: str | None = None  # default: the jobs topic
    group: str | None = None  # default: <kafka.group_id>.redrive


class Redrive:
    def __init__(self, cfg: WorkerConfig, req: RedriveRequest) -> None:
        names = task_topics(cfg)
        self.cfg, self.req, self.filter = cfg, req, req.filter
        to_topic = req.to_topic or names.jobs
        if to_topic == names.dlq:
            raise BadOption(f"--to-topic {to_topic} is the DLQ itself")
        self.summary = RedriveSummary(names.dlq, to_topic,
                                      req.group or default_redrive_group(cfg), req.dry_run)
        self.admin = Admin(cfg)

    def run(self) -> RedriveSummary:
        s, admin = self.summary, self.admin
        parts = admin.partitions(s.dlq)
        admin.partitions(s.to_topic)  # it must exist: a redrive creates nothing
        marks = admin.watermarks(s.dlq, parts, committed_only=True)
        committed = admin.committed(s.group, s.dlq, parts)
        ranges = {p: (scan_start(committed[p], *marks[p]), marks[p][1]) for p in parts}
        self.cursor = {p: start for p, (start, _) in ranges.items()}
        reader = DlqReader(self.cfg, s.group, s.dlq, ranges)
        fetcher = SourceFetcher(self.cfg, admin, s.group)
        sender = None if s.dry_run else Sender(self.cfg)
        try:
            for batch in reader.batches():
                self._batch(batch, reader, fetcher, sender)
                if s.limit_reached:
                    break
        finally:
            reader.close()
            fetcher.close()
            if sender is not None:
                sender.close()
        s.left = sum(end - self.cursor[p] for p, (_, end) in ranges.items())
        return s

    def _batch(self, batch: list[ck.Message], reader: DlqReader, fetcher: SourceFetcher,
               sender: Sender | None) -> None:
        """Handle a batch. What was handled is settled even if an error stops the batch:
        every job re-sent acknowledged first, then the DLQ offsets committed past them."""
        s = self.summary
        moved: dict[int, int] = {}
        try:
            for msg in batch:
                p, off = msg.partition(), msg.offset()
                if p is None or off is None or not reader.active(p):
                    continue
                if self.req.limit is not None and s.resent >= self.req.limit:
                    s.limit_reached = True
                    return
                ts = timestamp_ms(msg)
                if self.filter.after_window(ts):
                    reader.stop(p)
                    s.stopped_at_until += 1
                    continue
                self._one(msg, p, off, ts, fetcher, sender)
                self.cursor[p] = moved[p] = off + 1
        finally:
            if sender is not None:
                sender.confirm()
                reader.commit(moved)

    def _one(self, msg: ck.Message, p: int, off: int, ts: int | None,
             fetcher: SourceFetcher, sender: Sender | None) -> None:
        s = self.summary
        s.scanned += 1
        where = f"{s.dlq}/{p}/{off}"
        key, value, headers = msg.key(), msg.value(), header_list(msg)
        info = inspect(headers, value)
        if not self.filter.matches(info.reason, ts):
            s.passed_over += 1
            return
        s.matched += 1
        if info.reason is None:
            s.skip("not_a_dead_letter", where, "no ktw.dlq.error.reason header")
            return
        if info.bad_reference is not None:
            s.skip("bad_reference", where, info.bad_reference)
            return
        if info.reference is not None:
            got = fetcher.fetch(info.reference)
            if isinstance(got, str):
                s.skip("source_not_retained", where, got)
                return
            wrong = check_fetched(info.reference, got.value())
            if wrong is not None:
                s.skip("reference_mismatch", where, wrong)
                return
            key, value, headers = got.key(), got.value(), header_list(got)
        if sender is not None:
            sender.send(s.to_topic, key, value, redriven_headers(headers, s.dlq, p, off))
        s.sent(where, info.reason, key)


def redrive(cfg: WorkerConfig, req: RedriveRequest) -> RedriveSummary:
    return Redrive(cfg, req).run()
