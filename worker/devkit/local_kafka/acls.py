"""Grant and revoke ACLs on the local broker (as its PLAINTEXT super user), for tests that
need least-privilege principals: what a worker needs, or that minus one operation."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from .errors import LocalKafkaError


class Acls:
    """ALLOW bindings for one principal at a time, via confluent-kafka's AdminClient.

    grant() and revoke() return once the broker's authorizer applied the change (it reads
    the metadata log, a moment after the controller committed it), so the next request of
    a client sees it.
    """

    def __init__(self, bootstrap: str, timeout: float = 30.0) -> None:
        from confluent_kafka.admin import AdminClient

        self.timeout = timeout
        self._admin = AdminClient({"bootstrap.servers": bootstrap})

    @staticmethod
    def bindings(
        principal: str,
        *,
        read: Iterable[str] = (),
        write: Iterable[str] = (),
        describe: Iterable[str] = (),
        groups: Iterable[str] = (),
        transactional_ids: Iterable[str] = (),
        transactional_id_prefixes: Iterable[str] = (),
        idempotent_write: bool = False,
    ) -> list[Any]:
        """ALLOW bindings: topic READ / WRITE / DESCRIBE, group READ, transactional id WRITE
        and DESCRIBE (literal or by prefix), cluster IDEMPOTENT_WRITE. ``principal`` is
        ``User:<name>``."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        def allow(kind: Any, name: str, op: Any, pattern: Any = ResourcePatternType.LITERAL
                  ) -> Any:
            return AclBinding(kind, name, pattern, principal, "*", op, AclPermissionType.ALLOW)

        out = [allow(ResourceType.TOPIC, t, AclOperation.READ) for t in read]
        out += [allow(ResourceType.TOPIC, t, AclOperation.WRITE) for t in write]
        out += [allow(ResourceType.TOPIC, t, AclOperation.DESCRIBE) for t in describe]
        out += [allow(ResourceType.GROUP, g, AclOperation.READ) for g in groups]
        for pattern, ids in ((ResourcePatternType.LITERAL, transactional_ids),
                             (ResourcePatternType.PREFIXED, transactional_id_prefixes)):
            for tid in ids:
                out += [allow(ResourceType.TRANSACTIONAL_ID, tid, op, pattern)
                        for op in (AclOperation.WRITE, AclOperation.DESCRIBE)]
        if idempotent_write:
            out.append(allow(ResourceType.BROKER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE))
        return out

    @staticmethod
    def for_worker(principal: str, *, jobs: str, results: str, dlq: str, group: str,
                   transactional_id_prefix: str | None = None,
                   leave_out: Iterable[str] = ()) -> list[Any]:
        """What a worker needs: READ on ``jobs``, WRITE on ``results`` and ``dlq``, READ on
        ``group``, and for exactly-once WRITE on its transactional ids (by prefix).
        ``leave_out``: resource names whose grants to drop, to make a principal that lacks
        exactly that."""
        skip = set(leave_out)
        keep = [n for n in (results, dlq) if n not in skip]
        return Acls.bindings(
            principal, read=[jobs] if jobs not in skip else [], write=keep,
            groups=[group] if group not in skip else [],
            transactional_id_prefixes=([transactional_id_prefix]
                                       if transactional_id_prefix
                                       and transactional_id_prefix not in skip else []),
            idempotent_write=True)

    def grant(self, bindings: list[Any]) -> list[Any]:
        for binding, fut in self._admin.create_acls(bindings,
                                                    request_timeout=self.timeout).items():
            self._result(fut, f"granting {binding}")
        self._wait(bindings, present=True)
        return bindings

    def revoke(self, bindings: list[Any]) -> None:
        from confluent_kafka.admin import AclBindingFilter  # type: ignore[attr-defined]

        filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal,
                                    b.host, b.operation, b.permission_type) for b in bindings]
        for flt, fut in self._admin.delete_acls(filters, request_timeout=self.timeout).items():
            self._result(fut, f"revoking {flt}")
        self._wait(bindings, present=False)

    def granted(self, principal: str) -> set[Any]:
        """Every binding of ``principal``, as the broker's authorizer holds them now."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        flt = AclBindingFilter(ResourceType.ANY, None,  # type: ignore[arg-type]
                               ResourcePatternType.ANY, principal, None,  # type: ignore[arg-type]
                               AclOperation.ANY, AclPermissionType.ANY)
        found = self._result(self._admin.describe_acls(flt, request_timeout=self.timeout),
                             f"describing the ACLs of {principal}")
        return set(found)

    def _wait(self, bindings: list[Any], *, present: bool) -> None:
        deadline = time.monotonic() + self.timeout
        for principal in {b.principal for b in bindings}:
            mine = {b for b in bindings if b.principal == principal}
            while not (mine <= self.granted(principal) if present
                       else not mine & self.granted(principal)):
                if time.monotonic() > deadline:
                    raise LocalKafkaError(f"ACL change for {principal} not applied after "
                                          f"{self.timeout:.0f}s")
                time.sleep(0.05)

    def _result(self, fut: Any, what: str) -> Any:
        from confluent_kafka import KafkaException

        try:
            return fut.result(self.timeout)
        except KafkaException as exc:
            raise LocalKafkaError(f"{what} failed: {exc}") from exc
