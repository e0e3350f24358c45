"""The start-up ACL check's decisions (the broker's answers:
tests/integration/e2e/test_startup_checks.py)."""

from __future__ import annotations

import pytest
import structlog.testing

from worker.exceptions import KafkaIOError, TopicNotAuthorized
from worker.kafka.topics import check_authorized, may


class _Admin:
    def __init__(self, answer: dict[str, frozenset[str] | None] | Exception) -> None:
        self.answer = answer

    def authorized_operations(self, names: list[str]) -> dict[str, frozenset[str] | None]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_may() -> None:
    assert may(frozenset({"READ", "WRITE"}), "WRITE") and may(frozenset({"ALL"}), "WRITE")
    assert may(None, "WRITE")  # not reported: assume allowed, as without the check
    assert not may(frozenset({"READ", "DESCRIBE"}), "WRITE") and not may(frozenset(), "READ")


def test_every_refusal_is_named_and_nothing_else() -> None:
    admin = _Admin({"jobs": frozenset({"DESCRIBE"}), "results": frozenset({"READ"}),
                    "dlq": frozenset({"WRITE", "DESCRIBE"})})
    needs = {"jobs": "READ", "results": "WRITE", "dlq": "WRITE"}
    with pytest.raises(TopicNotAuthorized, match=r"this client READ on jobs, WRITE on results: "
                                                 r"grant it") as info:
        check_authorized(admin, needs)  # type: ignore[arg-type]
    assert "dlq" not in str(info.value)
    check_authorized(_Admin({"jobs": None, "results": frozenset({"ALL"}),  # type: ignore[arg-type]
                             "dlq": frozenset({"WRITE"})}), needs)


def test_a_broker_that_does_not_answer_is_not_an_error() -> None:
    with structlog.testing.capture_logs() as logs:
        check_authorized(_Admin(KafkaIOError("timed out")),  # type: ignore[arg-type]
                         {"jobs": "READ"})
    assert [e["event"] for e in logs] == ["topic_acls_not_checked"]


def test_a_topic_refused_even_to_describe_is_named_with_why() -> None:
    import confluent_kafka as ck

    class _Refusing(_Admin):
        def authorized_operations(self, names: list[str]) -> dict[str, frozenset[str] | None]:
            if "dlq" in names:  # as Admin: the first failed description fails the call
                raise KafkaIOError("Topic authorization failed",
                                   code=ck.KafkaError.TOPIC_AUTHORIZATION_FAILED)
            return dict.fromkeys(names, frozenset({"ALL"}))

    with pytest.raises(TopicNotAuthorized, match=r"this client WRITE on dlq \(not even "
                                                 r"DESCRIBE; it may not exist either\): grant"):
        check_authorized(_Refusing({}), {"jobs": "READ", "dlq": "WRITE"})  # type: ignore[arg-type]


def test_only_init_transactions_refusal_is_reported_as_a_missing_grant() -> None:
    import confluent_kafka as ck

    from worker.kafka.topics import transactional_id_refused

    refused = transactional_id_refused(
        KafkaIOError("x", code=ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED), "ktw.g.i")
    assert isinstance(refused, TopicNotAuthorized)
    assert "WRITE on transactional id ktw.g.i: grant it" in str(refused)
    assert transactional_id_refused(
        KafkaIOError("x", code=ck.KafkaError.PRODUCER_FENCED), "ktw.g.i") is None
