"""One request's record: what its answer, its log line and its metrics are made from."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway import pipeline
from schemas import events as ev


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
