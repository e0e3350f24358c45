"""What a redrive did, and how it reads to an operator."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger("worker.admin")
MAX_LISTED = 50  # skipped records named one by one


@dataclass(slots=True)
class RedriveSummary:
    dlq: str
    to_topic: str
    group: str
    dry_run: bool
    scanned: int = 0
    matched: int = 0
    resent: int = 0  # in a dry run: would be re-sent
    passed_over: int = 0  # not matching --reason / --since
    resent_by_reason: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    skipped_records: list[str] = field(default_factory=list)
    stopped_at_until: int = 0  # partitions whose scan ended at --until
    limit_reached: bool = False
    left: int = 0  # records after where this run stopped (--until, --limit)

    def sent(self, where: str, reason: str, key: bytes | None) -> None:
        """Count a re-sent job; the log line is the audit trail of every one."""
        self.resent += 1
        self.resent_by_reason[reason] += 1
        log.info("dlq_redriven", dlq_record=where, reason=reason, to_topic=self.to_topic,
                 key=key.decode("utf-8", "replace") if key else None, dry_run=self.dry_run)

    def skip(self, kind: str, where: str, detail: str) -> None:
        """Count a matching record that cannot be re-sent; each is logged, the first
        :data:`MAX_LISTED` are named in the summary too."""
        self.skipped[kind] += 1
        log.warning("dlq_redrive_skipped", dlq_record=where, kind=kind, detail=detail,
                    dry_run=self.dry_run)
        if len(self.skipped_records) < MAX_LISTED:
            self.skipped_records.append(f"{where} [{kind}] {detail}")

    def lines(self) -> list[str]:
        verb = "would re-send" if self.dry_run else "re-sent"
        out = [f"{'dry run: ' if self.dry_run else ''}redrive {self.dlq} -> {self.to_topic} "
               f"(group {self.group})",
               f"scanned: {self.scanned}  matched: {self.matched}  {verb}: {self.resent}  "
               f"skipped: {sum(self.skipped.values())}  not matching: {self.passed_over}"]
        if self.resent_by_reason:
            out.append(f"{verb} by reason: " + ", ".join(
                f"{k}={v}" for k, v in sorted(self.resent_by_reason.items())))
        if self.skipped:
            out.append("skipped by reason: " + ", ".join(
                f"{k}={v}" for k, v in sorted(self.skipped.items())))
            out += [f"  {r}" for r in self.skipped_records]
            if sum(self.skipped.values()) > len(self.skipped_records):
                out.append(f"  ... and {sum(self.skipped.values()) - len(self.skipped_records)}"
                           " more")
        if self.passed_over and not self.dry_run:
            out.append(f"note: {self.passed_over} record(s) did not match the filter; group "
                       f"{self.group} has moved past them (scan them again with another --group)")
        if self.limit_reached or self.stopped_at_until:
            why = "--limit reached" if self.limit_reached else "--until reached"
            out.append(f"stopped: {why}; {self.left} records left for a later run")
        if self.dry_run:
            out.append("dry run: nothing sent, no offsets committed")
        return out
