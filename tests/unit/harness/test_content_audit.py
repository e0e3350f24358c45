"""The fault drills' record-by-record audit finds each fault it is there for: a result under
another job's ce_id, a payload or subject naming another job, a dead letter pointing at another
record, and an exactly-once order inversion; repeats after a restart are not first-answer
inversions."""

from __future__ import annotations

import confluent_kafka as ck

from tests.harness.faults.content import content_audit, job_keys
from worker.wire.moderation_codec import encode_result
from worker.wire.moderation_jobs import ModerationResult, Status
from worker.wire.records import SourceRef

JOBS = "jobs-x"


def _job(p: int, o: int, key: str) -> ck.Message:
    return ck.Message(topic=JOBS, partition=p, offset=o, key=key.encode(), value=b"")


def _result(rp: int, src: tuple[int, int], key: str, *, subject: str | None = None,
            payload_id: str | None = None, named: tuple[int, int] | None = None) -> ck.Message:
    source = SourceRef(JOBS, *named) if named else None
    value = encode_result(ModerationResult(id=payload_id or key, status=Status.OK, policy="default",
                                           model_id="m", engine_hash="h", source=source))
    headers: list[tuple[str, str | bytes | None]] = [
        ("ce_id", f"{JOBS}-{src[0]}-{src[1]}".encode()), ("ce_subject", (subject or key).encode())]
    return ck.Message(topic="results", partition=rp, offset=0, key=key.encode(), value=value,
                      headers=headers)


def _dead(src: tuple[int, int], key: str) -> ck.Message:
    headers: list[tuple[str, str | bytes | None]] = [("ktw.dlq.source.topic", JOBS.encode()),
               ("ktw.dlq.source.partition", str(src[0]).encode()),
               ("ktw.dlq.source.offset", str(src[1]).encode())]
    return ck.Message(topic="dlq", partition=0, offset=0, key=key.encode(), value=b"",
                      headers=headers)


JOB_LIST = job_keys([_job(0, 0, "a"), _job(0, 1, "b"), _job(0, 2, "bad"), _job(0, 3, "c")])


def test_outputs_that_name_their_jobs_in_order_pass() -> None:
    out = content_audit(JOB_LIST, [_result(0, (0, 0), "a"), _result(0, (0, 1), "b"),
                                   _result(0, (0, 3), "c", named=(0, 3))],
                        [_dead((0, 2), "bad")], JOBS)
    assert out["content_faults"] == {} and out["order_inversions"] == 0


def test_each_kind_of_wrong_output_is_counted() -> None:
    results = [_result(0, (0, 1), "a"),  # ce_id names b's offset
               _result(0, (0, 1), "b", subject="c"),
               _result(0, (0, 3), "c", payload_id="a"),
               _result(0, (0, 3), "c", named=(0, 2))]
    out = content_audit(JOB_LIST, results, [_dead((0, 1), "bad")], JOBS)
    assert out["content_faults"] == {"ce_id_not_its_job": 1, "ce_subject_not_key": 1,
                                     "payload_id_not_key": 1, "payload_source_not_ce_id": 1,
                                     "dlq_source_not_its_job": 1}


def test_a_repeat_from_the_committed_offset_is_an_inversion_but_not_a_first_answer_one() -> None:
    repeat = [_result(0, (0, 0), "a"), _result(0, (0, 1), "b"), _result(0, (0, 0), "a"),
              _result(0, (0, 1), "b"), _result(0, (0, 3), "c")]
    out = content_audit(JOB_LIST, repeat, [], JOBS)
    assert (out["order_inversions"], out["first_answer_inversions"]) == (1, 0)
    swapped = [_result(0, (0, 1), "b"), _result(0, (0, 0), "a")]
    out = content_audit(JOB_LIST, swapped, [], JOBS)
    assert (out["order_inversions"], out["first_answer_inversions"]) == (1, 1)
