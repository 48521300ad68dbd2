"""Structured JSON logs: one line per request, one per bug, none per chunk; the standard
library's loggers (uvicorn's among them) are rendered by the same processors, so every line on
stderr is one JSON object."""

from __future__ import annotations

import logging
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import orjson
import structlog
import uvicorn

if TYPE_CHECKING:
    from gateway.exchange import Exchange

_log: Any = structlog.get_logger("gateway")


def _dumps(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj, default=str).decode()


def configure(level: str = "info") -> None:
    """JSON lines on stderr via orjson; called once by the CLI, before uvicorn starts."""
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # structlog's documented way to render foreign (stdlib) records: ProcessorFormatter.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name,
                           stamp],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    structlog.processors.JSONRenderer(serializer=_dumps)]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        stdlib = logging.getLogger(name)
        stdlib.handlers.clear()  # uvicorn's own plain-text handlers, if it installed them
        stdlib.propagate = True


def logger() -> Any:
    return _log


def log_exchange(x: Exchange) -> None:
    """The request's one log line, and its metrics and span: 4xx at info (the caller's
    mistake), 5xx and failures upstream at warning, a gateway bug at error."""
    now = time.perf_counter()
    if x.watch is not None:
        x.watch.finish(x, now)
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
    if x.error_type:
        fields["error_type"] = x.error_type
    if x.note.errors:
        fields["upstream_errors"] = x.note.errors
    if x.outcome == "bug":
        _log.error("request", **fields)
    elif x.status >= 500 or x.outcome == "upstream_error" or x.note.errors:
        _log.warning("request", **fields)
    else:
        _log.info("request", **fields)


def log_bug(request_id: str, exc: BaseException) -> None:
    _log.error("bug", request_id=request_id, exc_info=exc)


class Server(uvicorn.Server):
    """uvicorn's server, logging `drain` when a signal ends serving (in-flight streams then
    get `timeout_graceful_shutdown`, before the lifespan's shutdown logs `stop`)."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.should_exit:
            _log.info("drain", signal=signal.Signals(sig).name,
                      drain_seconds=self.config.timeout_graceful_shutdown)
        super().handle_exit(sig, frame)
