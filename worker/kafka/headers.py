"""Reading a consumed record's headers without letting the record stop the reader.

Kafka header keys are bytes on the wire, and Go, Rust and C clients (librdkafka included) write
any bytes there; confluent-kafka-python decodes each key as UTF-8 when ``Message.headers()``
is first called and, for a key that is not valid UTF-8, fails (a ``SystemError`` caused by the
``UnicodeDecodeError``, see ``_HEADERS``). A worker that let that escape would stop on the
record, and so would every restart and every member taking the partition: it could never be
dead-lettered. Every reader of consumed headers goes through :func:`read_headers` instead.
"""

from __future__ import annotations

import operator
from typing import Protocol, cast

from worker.exceptions import one_line
from worker.wire.records import Headers


class HasHeaders(Protocol):
    """What :func:`read_headers` needs of a consumed record (a ``confluent_kafka.Message``)."""

    def headers(self) -> object: ...


# The call goes through C: confluent-kafka's failed conversion returns the half-built list
# with the exception still set, which the generic call path turns into a SystemError. A
# Python-level ``msg.headers()`` call site, once CPython has specialised it (after a few calls:
# a worker's first records), skips that check: the list comes back with a NULL in it and the
# decode error is raised later, at an unrelated line, outside any guard.
_HEADERS = operator.methodcaller("headers")


def read_headers(msg: HasHeaders) -> tuple[Headers | None, str | None]:
    """``(headers, None)``: the record's headers as a list (None when it has none); or
    ``(None, why)`` when they cannot be read, ``why`` one line naming the cause.

    Call it once per message and keep the result: after a failed conversion, confluent-kafka
    caches a half-built list (a NULL where the key should be) and a second ``headers()`` call
    returns it instead of raising."""
    try:
        headers = _HEADERS(msg)
    except (SystemError, ValueError) as exc:  # (UnicodeDecodeError is a ValueError)
        # The SystemError only says a C function failed; its cause names the bad bytes.
        cause = exc.__cause__ or exc.__context__ or exc
        return None, one_line(f"record headers unreadable: {type(cause).__name__}: {cause}")
    if isinstance(headers, dict):
        return list(headers.items()), None
    return cast("Headers | None", headers), None  # (a list of (str, bytes | None) tuples)
