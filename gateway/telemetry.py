"""One request's telemetry: its metrics, its trace context upstream and, with OpenTelemetry
enabled, its span and one child span per upstream attempt.

The pipeline reports each attempt's start and failure (`Watch.begin` / `Watch.end`, the
`pipeline.AttemptObserver` protocol); `Watch.finish` records the rest once the answer's last
byte is sent. Nothing here runs per streamed chunk.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway import metrics, tracing, upstream
from schemas import canonical, errors

if TYPE_CHECKING:
    from gateway.exchange import Exchange
    from gateway.routing import Route

try:  # the `otel` extra; without it the gateway still passes trace context through
    from opentelemetry import trace as otel
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _W3C: Any = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised by installs without the extra
    otel = None  # type: ignore[assignment]
    _W3C = None

# W3C Trace Context (https://www.w3.org/TR/trace-context/): the two headers vLLM reads too.
TRACE_HEADERS = ("traceparent", "tracestate")


OTHER = "_OTHER"
# `gen_ai.response.finish_reasons` in the conventions' own words (gen-ai-output-messages.json,
# `FinishReason`: stop, length, content_filter, tool_call, error): a dashboard reads one
# vocabulary whichever worker answered. What the enum has no word for keeps the gateway's.
OTEL_FINISH: dict[str, str] = {
    "eos": "stop", "stop_string": "stop", "stop_token": "stop", "length": "length",
    "tool_calls": "tool_call", "content_filter": "content_filter", "error": "error",
}
FAILED_OUTCOMES = frozenset(("error", "upstream_error", "bug", "shutdown"))


def error_type(exc: BaseException) -> str:
    """`error.type`: the gateway error's class name, a bounded set; anything else a bug."""
    if isinstance(exc, errors.GatewayError):
        return type(exc).__name__
    return "internal"


def operation(req: canonical.InferenceRequest) -> str:
    """`gen_ai.operation.name`: `chat` for messages, `text_completion` for raw prompts."""
    return "chat" if req.messages is not None else "text_completion"


class Watch:
    """What one request's telemetry needs between its arrival and its last byte."""

    __slots__ = ("_failover", "_open", "_route", "_span", "_tracer", "_upstream_model",
                 "attempts", "client_trace", "model", "operation", "provider", "routed",
                 "series")

    def __init__(self, tracing_: tracing.Tracing | None, headers: Mapping[str, str], route: str):
        # (a comprehension is a call of its own: made only where the client sent trace context)
        self.client_trace = {k: headers[k] for k in TRACE_HEADERS if k in headers} \
            if "traceparent" in headers or "tracestate" in headers else {}
        self.model = self._upstream_model = metrics.UNKNOWN_MODEL
        # Required labels, known once the request is routed; `_OTHER` for a request refused
        # before that (the conventions' value for one outside the list)
        self.provider = self.operation = OTHER
        self.routed = False
        self.series: metrics.Routed | None = None  # once routed: its labels' series
        self._route = route
        self.attempts = 0
        self._failover = False
        # attempts begun and not yet ended, by their ticket (pipeline.Pipeline._attempt): a
        # stream of several choices is continued by as many attempts at once (gateway.failover)
        self._open: dict[int | None, tuple[str, float, Any]] = {}
        self._tracer: Any = tracing_.tracer if tracing_ is not None else None
        self._span: Any = None
        if self._tracer is not None:
            self._span = self._tracer.start_span(
                route, context=_W3C.extract(headers), kind=otel.SpanKind.SERVER,
                attributes={"http.route": route})

    def route(self, route: Route, req: canonical.InferenceRequest) -> None:
        """The request is parsed and its model resolved: it counts as in flight from now."""
        self.model, self.provider = route.name, route.config.backend
        self._upstream_model = route.upstream_model
        self.operation = operation(req)
        self.routed = True
        series = self.series = metrics.routed(self._route, self.operation, self.model,
                                              self.provider)
        series.in_flight.add(1.0)
        series.touch()
        if self._span is not None:
            self._span.update_name(f"{self.operation} {self.model}")
            self._span.set_attributes(request_attributes(self, req))

    def begin(self, url: str, ticket: int | None) -> dict[str, str]:
        """An attempt on `url` starts (`ticket`: its own); the trace headers to send it."""
        if self.attempts and not self._failover:  # a failover is counted as one (hooks)
            metrics.retry(self.model, url)
        self._failover = False
        self.attempts += 1
        started = time.perf_counter()
        if self._span is None:
            self._open[ticket] = (url, started, None)
            return dict(self.client_trace)
        host, port = metrics.address(url)
        span = self._tracer.start_span(  # named for the model the worker serves
            f"{self.operation} {self._upstream_model}",
            context=otel.set_span_in_context(self._span), kind=otel.SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": self.operation,
                "gen_ai.request.model": self._upstream_model,
                "gen_ai.provider.name": self.provider, "server.address": host, "server.port": port,
                "url.full": upstream.shown(url)})
        self._open[ticket] = (url, started, span)
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=otel.set_span_in_context(span))
        return carrier

    def failing_over(self) -> None:
        self._failover = True

    def end(self, ticket: int | None, error: BaseException | None) -> None:
        """The attempt of `ticket` failed (`error`) or its answer ended (None)."""
        attempt = self._open.pop(ticket, None)
        if attempt is not None:
            self._close_attempt(attempt, error_type(error) if error is not None else "")

    def _close_attempt(self, attempt: tuple[str, float, Any], etype: str) -> None:
        url, started, span = attempt
        series = self.series
        if series is not None and not etype:  # the common case: found once, marked once
            attempts, duration = series.upstream(url)
            attempts.add(1.0)
            duration.add(time.perf_counter() - started)
            series.touch()
        else:
            host, port = metrics.address(url)
            metrics.attempt(self.model, url, etype)
            metrics.child(metrics.OPERATION_DURATION, self.operation, self.model, self.provider,
                          host, str(port), etype).observe(time.perf_counter() - started)
        if span is not None:
            _end_span(span, etype, etype != "")

    def finish(self, x: Exchange, ended: float) -> None:
        """The answer's last byte is out (or the client is gone): record the request."""
        etype = x.error_type
        if self._open:  # those still open end with the request (its error, if any)
            for attempt in self._open.values():
                self._close_attempt(attempt, etype)
            self._open.clear()
        series = self.series
        if series is not None:
            series.in_flight.add(-1.0)
        record(self, x, ended)
        if series is not None:  # what was added to its series, flushed at the turn's end
            series.touch()
        if self._span is not None:
            self._span.set_attributes(response_attributes(x, ended))
            if self.routed:  # the model that answered, as the worker serves it
                self._span.set_attribute("gen_ai.response.model", self._upstream_model)
            # A failed generation is an error also where its protocol answered it with a 200
            # (an in-band error after the first byte, TGI's error event); a client's mistake
            # (4xx) or its leaving is not the server's error (recording-errors.md).
            failed = x.status >= 500 or x.outcome in FAILED_OUTCOMES or (etype != ""
                                                                        and not x.status)
            _end_span(self._span, etype, failed)
            self._span = None


def record(w: Watch, x: Exchange, ended: float) -> None:
    """The request's metrics (semantic conventions: TTFT and TPOT of successful streams)."""
    series = w.series
    if series is not None and 200 <= x.status < 300 and not x.error_type \
            and series.route == x.route:
        _record_routed(series, x, ended)
        return
    genai = (w.operation, w.model, w.provider)
    child = metrics.child
    status = metrics.status_class(x.status)
    child(metrics.REQUEST_DURATION, *genai, x.route, status, x.error_type).observe(
        ended - x.started)
    child(metrics.REQUESTS, w.model, x.route, status).inc()
    if x.error_type:
        child(metrics.ERRORS, w.model, x.route, x.error_type).inc()
    if x.usage is not None:
        child(metrics.TOKEN_USAGE, *genai, "input").observe(x.usage.prompt_tokens)
        child(metrics.TOKEN_USAGE, *genai, "output").observe(x.usage.completion_tokens)
    if not x.stream or x.first_event_at is None or x.error_type:
        return
    child(metrics.TIME_TO_FIRST_TOKEN, *genai).observe(x.first_event_at - x.started)
    if x.usage is not None and x.usage.completion_tokens > 1:
        child(metrics.TIME_PER_OUTPUT_TOKEN, *genai).observe(
            (ended - x.first_event_at) / (x.usage.completion_tokens - 1))


def _record_routed(series: metrics.Routed, x: Exchange, ended: float) -> None:
    """`record` of a routed request answered with a 2xx and no error, by its `Routed` series
    (which the caller marks changed: `Watch.finish`)."""
    series.duration.add(ended - x.started)
    series.requests.add(1.0)
    if x.usage is not None:
        series.tokens_in.add(x.usage.prompt_tokens)
        series.tokens_out.add(x.usage.completion_tokens)
    if x.stream and x.first_event_at is not None:
        series.ttft.add(x.first_event_at - x.started)
        if x.usage is not None and x.usage.completion_tokens > 1:
            series.tpot.add((ended - x.first_event_at) / (x.usage.completion_tokens - 1))


def request_attributes(w: Watch, req: canonical.InferenceRequest) -> dict[str, Any]:
    """GenAI request attributes (semantic conventions, gen-ai-spans.md)."""
    out: dict[str, Any] = {
        "gen_ai.operation.name": w.operation, "gen_ai.request.model": w.model,
        "gen_ai.provider.name": w.provider, "gen_ai.request.stream": req.stream}
    s = req.sampling
    for key, value in (("max_tokens", s.max_tokens), ("temperature", s.temperature),
                       ("top_p", s.top_p), ("top_k", s.top_k), ("seed", s.seed),
                       ("frequency_penalty", s.frequency_penalty),
                       ("presence_penalty", s.presence_penalty)):
        if value is not None:
            out[f"gen_ai.request.{key}"] = value
    if s.n != 1:
        out["gen_ai.request.choice.count"] = s.n
    if s.stop:
        out["gen_ai.request.stop_sequences"] = list(s.stop)
    return out


def response_attributes(x: Exchange, ended: float) -> dict[str, Any]:
    out: dict[str, Any] = {"http.response.status_code": x.status, "gateway.request_id":
                           x.request_id, "gateway.upstream_attempts": x.note.attempts}
    if x.response_id:
        out["gen_ai.response.id"] = x.response_id
    if x.finish_reasons:
        out["gen_ai.response.finish_reasons"] = [OTEL_FINISH.get(r, r)
                                                 for r in x.finish_reasons]
    if x.usage is not None:
        out["gen_ai.usage.input_tokens"] = x.usage.prompt_tokens
        out["gen_ai.usage.output_tokens"] = x.usage.completion_tokens
    if x.stream and x.first_event_at is not None:  # "in a streaming response"
        out["gen_ai.response.time_to_first_chunk"] = x.first_event_at - x.started
    if x.error_type:
        out["error.type"] = x.error_type
    return out


def _end_span(span: Any, etype: str, failed: bool) -> None:
    if failed:  # no description: repeating error.type there is NOT RECOMMENDED
        span.set_status(otel.Status(otel.StatusCode.ERROR))
        span.set_attribute("error.type", etype or "_OTHER")
    span.end()
