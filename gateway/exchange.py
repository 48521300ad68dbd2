"""One request's record: what its answer, its log line and its metrics are made from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway import pipeline
from schemas import events as ev

if TYPE_CHECKING:
    from gateway.telemetry import Watch


@dataclass(slots=True)
class Exchange:
    """One request's state, for its answer and its log line."""

    request_id: str
    path: str
    started: float
    status: int = 0
    model: str | None = None
    stream: bool = False
    first_event_at: float | None = None
    reads: int = 0  # upstream reads streamed (for the inter-token latency metric)
    usage: ev.Usage | None = None
    error: str | None = None
    outcome: str = "ok"
    note: pipeline.Attempt = field(default_factory=pipeline.Attempt)
    head_sent: bool = False
    finishing: bool = False
    route: str = ""  # the route's template (`/predictions/{model}`), never the raw path
    error_type: str = ""  # `error.type`: the error's class name; "" when none
    response_id: str = ""
    finish_reasons: list[str] = field(default_factory=list)
    watch: Watch | None = None
