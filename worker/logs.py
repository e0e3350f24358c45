"""structlog set-up: JSON lines by default (one event per line, machine-parseable).

Standard-library loggers (librdkafka's, via confluent-kafka's ``logger`` setting) are rendered
by the same processors, so every line on stderr has one format.
"""

from __future__ import annotations

import logging
import sys

import structlog

from worker.observe.events import count_events, count_foreign_events

_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    # Tracebacks never show local variables: a frame's locals can hold the client settings,
    # secrets in the clear (structlog's console default, a rich traceback, shows them).
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False,
                                           exception_formatter=structlog.dev.plain_traceback)
    )
    structlog.configure(
        processors=[
            # Drop below-level events before any other processor runs: per-job debug lines
            # must cost nothing on the hot path when the level is INFO or above.
            structlog.stdlib.filter_by_level,
            count_events,
            *_SHARED,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            # A standard-library record's exception becomes a plain traceback string here,
            # as the worker's own events' do, before either renderer sees it.
            foreign_pre_chain=[count_foreign_events, *_SHARED,
                               structlog.processors.format_exc_info],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
