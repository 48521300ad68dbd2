"""Structured JSON logs: one line per request, one per bug, none per chunk; the standard library's
loggers (asyncio's, and uvicorn's where the benchmark serves with it) are rendered by the same
processors, so every line on stderr is one JSON object."""

from __future__ import annotations

import asyncio
import logging
import select
import sys
import time
from typing import IO, TYPE_CHECKING, Any

import orjson
import structlog

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
        # one write per line: PrintLogger's print() writes the line and its newline apart, and
        # with several serving processes on the one stderr (server.workers) another process's
        # line then lands between them: two records on one line and an empty one.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
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
    global _lines
    _lines = RequestLines(sys.stderr) if level in ("debug", "info") else None
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        stdlib = logging.getLogger(name)
        stdlib.handlers.clear()  # uvicorn's own plain-text handlers, if it installed them
        stdlib.propagate = True


class RequestLines:
    """The per-request line at info, as structlog's chain above would render it, but made by
    one `orjson.dumps` and written once per event-loop turn for all the requests that ended in
    it: the benchmark's profile showed structlog's processors and a write per request at 8 %
    of the gateway's CPU for whole answers."""

    def __init__(self, out: IO[str]):
        self.out = out.buffer if hasattr(out, "buffer") else None
        self.text = out
        self.pending: list[bytes] = []
        self._second = -1
        self._stamp = ""

    def add(self, fields: dict[str, Any]) -> None:
        fields.update(structlog.contextvars.get_contextvars())
        fields["event"] = "request"
        fields["level"] = "info"
        fields["timestamp"] = self.timestamp()
        self.pending.append(orjson.dumps(fields, default=str, option=orjson.OPT_APPEND_NEWLINE))
        if len(self.pending) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: write now
                self.flush()

    def timestamp(self) -> str:
        """ISO 8601 in UTC with microseconds, as structlog's TimeStamper(fmt="iso", utc=True)."""
        second, micros = divmod(time.time_ns() // 1000, 1_000_000)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
        return f"{self._stamp}{micros:06d}Z"

    def flush(self) -> None:
        data = b"".join(self.pending)
        self.pending.clear()
        for piece in whole_lines(data):
            if self.out is not None:
                self.out.write(piece)
                self.out.flush()
            else:
                self.text.write(piece.decode())
                self.text.flush()


def whole_lines(data: bytes, limit: int = select.PIPE_BUF) -> list[bytes]:
    """`data` (whole lines) in writes of at most `limit` bytes cut after a newline (a longer
    line alone): POSIX keeps a pipe write of up to PIPE_BUF bytes whole, while a longer one
    may be interleaved with other processes' writes, and the serving processes of
    `server.workers` share the one stderr, a pipe under a container runtime."""
    if len(data) <= limit:
        return [data]
    out = []
    start = 0
    while start < len(data):
        end = data.rfind(b"\n", start, start + limit) + 1
        if end <= start:  # one line past the limit: alone
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline + 1
        out.append(data[start:end])
        start = end
    return out


_lines: RequestLines | None = None


def logger() -> Any:
    return _log


# Outcomes that told the client of an error although its status may be a 200 (in-band).
_WARNED = frozenset(("upstream_error", "shutdown"))


def log_exchange(x: Exchange) -> None:
    """The request's one log line, and its metrics and span: 4xx at info (the caller's
    mistake), 5xx, failures upstream and streams the shutdown cut at warning (the client was
    told of an error, in-band after a 200 too), a gateway bug at error."""
    now = time.perf_counter()
    if x.watch is not None:
        x.watch.finish(x, now)
    fields: dict[str, Any] = {
        "request_id": x.request_id, "path": x.path, "model": x.model, "stream": x.stream,
        "status": x.status, "outcome": x.outcome,
        "duration_ms": _ms(now - x.started),
        "upstream": x.note.upstream, "attempts": x.note.attempts,
    }
    if x.first_event_at is not None:
        fields["ttft_ms"] = _ms(x.first_event_at - x.started)
    if x.usage is not None:
        fields["prompt_tokens"] = x.usage.prompt_tokens
        fields["completion_tokens"] = x.usage.completion_tokens
    if x.error is not None:
        fields["error"] = x.error
    if x.error_type:
        fields["error_type"] = x.error_type
    if x.note.errors:
        fields["upstream_errors"] = x.note.errors
    if x.note.failovers:  # a stream cut mid-way and continued elsewhere (gateway.failover)
        fields["failovers"] = x.note.failovers
    if x.outcome == "bug":
        _log.error("request", **fields)
    elif x.status >= 500 or x.outcome in _WARNED or x.note.errors:
        _log.warning("request", **fields)
    elif _lines is not None:  # configured by the CLI: the batched writer
        _lines.add(fields)
    else:
        _log.info("request", **fields)


def _ms(seconds: float) -> float:
    """Milliseconds to the microsecond, as `round(seconds * 1000, 3)` gives them (but for a
    tie, which a clock reading is not): `round` with digits goes through a decimal string and
    back, about a microsecond for the two of a log line."""
    return int(seconds * 1e6 + 0.5) / 1000


def log_bug(request_id: str, exc: BaseException) -> None:
    _log.error("bug", request_id=request_id, exc_info=exc)
