"""One request's record: what its answer, its log line and its metrics are made from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway import pipeline
from schemas import canonical
from schemas import events as ev

if TYPE_CHECKING:
    from gateway.routing import Route


class Watcher(Protocol):
    """What follows one request for its metrics and spans (telemetry.Watch): told the route
    once it is known, then the finished exchange. Declared here so that this record does not
    import the telemetry that reads it (no import circle, not even for type checking)."""

    def route(self, route: Route, req: canonical.InferenceRequest) -> None: ...

    def finish(self, x: Exchange, ended: float) -> None: ...


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
    usage: ev.Usage | None = None
    error: str | None = None
    outcome: str = "ok"
    note: pipeline.Attempt = field(default_factory=pipeline.Attempt)
    head_sent: bool = False
    finishing: bool = False
    route: str = ""  # the route's template (`/predictions/{model}`), never the raw path
    error_type: str = ""  # `error.type`: the error's class name; "" when none
    response_id: str = ""
    finish_reasons: Sequence[str] = ()  # set once the answer is known (a list then)
    watch: Watcher | None = None
    echoed: tuple[tuple[bytes, bytes], ...] = ()  # request headers every answer carries back
