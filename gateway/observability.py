"""Structured JSON logs: one line per request, one per bug, none per chunk."""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any

import orjson
import structlog

from gateway import metrics

if TYPE_CHECKING:
    from gateway.exchange import Exchange

_log: Any = structlog.get_logger("gateway")


def configure(level: str = "info") -> None:
    """JSON lines on stderr via orjson; called once by the CLI."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=lambda o, **_: orjson.dumps(o).decode()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def logger() -> Any:
    return _log


def log_exchange(x: Exchange) -> None:
    """The request's one log line, and its metrics."""
    now = time.perf_counter()
    metrics.record(x, now)
    fields: dict[str, Any] = {
        "request_id": x.request_id, "path": x.path, "model": x.model, "stream": x.stream,
        "status": x.status, "outcome": x.outcome,
        "duration_ms": round((now - x.started) * 1000, 3),
        "upstream": x.note.upstream, "attempts": x.note.attempts,
    }
    if x.first_event_at is not None:
        fields["ttft_ms"] = round((x.first_event_at - x.started) * 1000, 3)
    if x.usage is not None:
        fields["prompt_tokens"] = x.usage.prompt_tokens
        fields["completion_tokens"] = x.usage.completion_tokens
    if x.error is not None:
        fields["error"] = x.error
    if x.note.errors:
        fields["upstream_errors"] = x.note.errors
    _log.info("request", **fields)


def log_bug(request_id: str, exc: BaseException) -> None:
    _log.error("bug", request_id=request_id, exc_info=exc)
