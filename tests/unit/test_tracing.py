"""Traces: a client's W3C trace context reaches the worker (always), and with OpenTelemetry
enabled a streamed request gives a server span `chat {model}` with GenAI attributes and one
client span per upstream attempt, checked with the SDK's in-memory span exporter."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from typing import Any

import httpx
import orjson
import pytest
import respx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway import app as gateway_app
from gateway import config, telemetry, tracing, upstream, upstream_clients
from schemas import events
from tests.unit.test_failover_respx import REST, TWO_CHOICES_HEAD
from tests.unit.test_metrics import STREAM_USAGE
from tests.unit.test_pipeline_respx import CHAT, UP1, UP2, WHOLE_OK, Reads, make_config

# The example of the W3C Trace Context recommendation, section 3.2.
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
TRACESTATE = "congo=t61rcWkgMzE"


async def post(router: respx.MockRouter, body: dict[str, Any], headers: dict[str, str],
               traces: tracing.Tracing | None = None) -> httpx.Response:
    def factory(_: config.Config) -> upstream.UpstreamClient:
        return upstream_clients.HttpxClient(httpx.AsyncClient(transport=httpx.MockTransport(
            router.async_handler)))

    app = gateway_app.build_app(make_config(), factory, traces)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw") as client:
            return await client.post("/v1/chat/completions", content=orjson.dumps(body),
                                     headers=headers)


def worker_saw(router: respx.MockRouter) -> list[httpx.Request]:
    return [call.request for call in router.calls]


@pytest.mark.anyio
async def test_trace_context_reaches_the_worker_without_opentelemetry_enabled() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(url__startswith="http://up").mock(return_value=httpx.Response(
            200, content=STREAM_USAGE, headers={"content-type": "text/event-stream"}))
        resp = await post(r, {**CHAT, "stream": True},
                          {"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
        seen = worker_saw(r)
    assert resp.status_code == 200
    assert [(q.headers["traceparent"], q.headers["tracestate"]) for q in seen] == [
        (TRACEPARENT, TRACESTATE)]


@pytest.mark.anyio
async def test_no_trace_headers_invented_when_the_client_sent_none() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(url__startswith="http://up").mock(return_value=httpx.Response(
            200, content=STREAM_USAGE, headers={"content-type": "text/event-stream"}))
        await post(r, {**CHAT, "stream": True}, {})
        (seen,) = worker_saw(r)
    assert "traceparent" not in seen.headers


@pytest.mark.anyio
async def test_a_streamed_request_gives_a_span_tree_with_genai_attributes() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    failing = {UP1: 0, UP2: 0}

    def answer(req: httpx.Request) -> httpx.Response:
        host = f"http://{req.url.host}:{req.url.port}"
        if not failing[UP1] and not failing[UP2]:  # the first attempt fails, whichever it is
            failing[host] += 1
            return httpx.Response(503, json={"error": {"message": "busy", "code": 503}})
        return httpx.Response(200, content=STREAM_USAGE,
                              headers={"content-type": "text/event-stream"})

    with respx.mock(assert_all_called=False) as r:
        r.post(url__startswith="http://up").mock(side_effect=answer)
        body = {**CHAT, "stream": True, "max_tokens": 3, "temperature": 0.5}
        resp = await post(r, body, {"traceparent": TRACEPARENT, "tracestate": TRACESTATE},
                          tracing.Tracing.of(provider))
        seen = worker_saw(r)
    assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind == trace.SpanKind.SERVER]
    attempts = sorted((s for s in spans if s.kind == trace.SpanKind.CLIENT),
                      key=lambda s: s.start_time or 0)
    assert len(spans) == 3 and len(attempts) == 2
    assert server.name == "chat demo"
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert server.parent is not None and f"{server.parent.span_id:016x}" == CLIENT_SPAN
    assert all(a.parent is not None and a.parent.span_id == server.context.span_id
               for a in attempts)
    attrs = dict(server.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "demo"
    assert attrs["gen_ai.provider.name"] == "vllm"
    assert attrs["gen_ai.request.max_tokens"] == 3
    assert attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.request.stream"] is True
    # The gateway's response id; each protocol dresses it (OpenAI: `chatcmpl-<id>`).
    assert attrs["gen_ai.response.id"] in orjson.loads(
        resp.text.split("data: ", 2)[1].split("\n")[0])["id"]
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (7, 3)
    assert 0 < attrs["gen_ai.response.time_to_first_chunk"] < 10
    assert attrs["http.route"] == "/v1/chat/completions"
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.response.model"] == "org/model"  # as the worker serves it
    assert server.status.status_code == trace.StatusCode.UNSET
    # The server span ends with the stream: after both attempts, not before the last one.
    assert server.end_time is not None and attempts[-1].end_time is not None
    assert server.end_time >= attempts[-1].end_time
    first, second = attempts
    assert first.status.status_code == trace.StatusCode.ERROR
    assert dict(first.attributes or {})["error.type"] == "UpstreamUnavailable"
    assert second.status.status_code == trace.StatusCode.UNSET
    # Each worker request names its own attempt span as the parent, in the client's trace.
    assert [q.headers["traceparent"] for q in seen] == [
        f"00-{TRACE_ID}-{a.context.span_id:016x}-01" for a in attempts]
    assert all(q.headers["tracestate"] == TRACESTATE for q in seen)


def spans_of(body: dict[str, Any], answer: httpx.Response) -> list[Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def run() -> None:
        with respx.mock(assert_all_called=False) as r:
            r.post(url__startswith="http://up").mock(return_value=answer)
            await post(r, body, {}, tracing.Tracing.of(provider))

    import anyio
    anyio.run(run)
    return list(exporter.get_finished_spans())


def test_a_stream_that_fails_after_its_first_byte_is_an_error_span() -> None:
    """recording-errors.md: an operation that ends with an error SHOULD set the span status
    to Error and `error.type` (with no description repeating it), also where the protocol told
    the client in-band after a 200."""
    cut = STREAM_USAGE[:STREAM_USAGE.index(b"\n\n") + 2]  # one event, then the end: broken
    spans = spans_of({**CHAT, "stream": True}, httpx.Response(
        200, content=cut, headers={"content-type": "text/event-stream"}))
    (server,) = [s for s in spans if s.kind == trace.SpanKind.SERVER]
    attrs = dict(server.attributes or {})
    assert attrs["http.response.status_code"] == 200
    assert server.status.status_code == trace.StatusCode.ERROR and not server.status.description
    assert attrs["error.type"] == "UpstreamBroken"


def chunk(choices: str, extra: str = "") -> bytes:
    return (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
            b'"choices":[%s]%s}\n\n' % (choices.encode(), extra.encode()))


def test_each_finish_reason_is_named_as_the_conventions_name_it() -> None:
    """gen-ai-output-messages.json (open-telemetry/semantic-conventions, docs/gen-ai):
    `FinishReason` is one of stop, length, content_filter, tool_call, error, or another
    string. Every way the gateway's answers end maps into that enum, save an abort, which it
    has no word for."""
    enum = {"stop", "length", "content_filter", "tool_call", "error"}
    ours = set(typing.get_args(events.FinishReason))
    assert {r: telemetry.OTEL_FINISH[r] for r in ours - {"abort"}} == {
        "eos": "stop", "stop_string": "stop", "stop_token": "stop", "length": "length",
        "tool_calls": "tool_call", "content_filter": "content_filter", "error": "error"}
    assert set(telemetry.OTEL_FINISH.values()) == enum
    assert "abort" not in telemetry.OTEL_FINISH


def test_every_choice_finish_of_a_stream_is_in_its_span() -> None:
    """gen_ai.response.finish_reasons: one per choice (gen-ai-spans.md), also for a choice
    that finished many reads before the stream's end, in the conventions' vocabulary
    (gen-ai-output-messages.json's `FinishReason`: stop, length, content_filter, tool_call,
    error), not the gateway's own (`eos`)."""
    parts = [chunk('{"index":0,"delta":{"content":"a"},"finish_reason":null},'
                   '{"index":1,"delta":{"content":"b"},"finish_reason":null}'),
             chunk('{"index":0,"delta":{},"finish_reason":"stop"}'),
             chunk('{"index":1,"delta":{"content":"c"},"finish_reason":null}'),
             chunk('{"index":1,"delta":{"content":"d"},"finish_reason":null}'),
             chunk('{"index":1,"delta":{},"finish_reason":"length"}'),
             chunk("", ',"usage":{"prompt_tokens":4,"total_tokens":7,"completion_tokens":3}'),
             b"data: [DONE]\n\n"]
    spans = spans_of({**CHAT, "stream": True, "n": 2}, httpx.Response(
        200, stream=Reads(parts), headers={"content-type": "text/event-stream"}))
    (server,) = [s for s in spans if s.kind == trace.SpanKind.SERVER]
    attrs = dict(server.attributes or {})
    assert attrs["gen_ai.response.finish_reasons"] == ("stop", "length")
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (4, 3)


def test_a_whole_answer_has_no_time_to_first_chunk() -> None:
    """gen-ai-spans.md: gen_ai.response.time_to_first_chunk is for streaming responses."""
    spans = spans_of(CHAT, httpx.Response(200, content=WHOLE_OK,
                                          headers={"content-type": "application/json"}))
    (server,) = [s for s in spans if s.kind == trace.SpanKind.SERVER]
    assert "gen_ai.response.time_to_first_chunk" not in dict(server.attributes or {})


@pytest.mark.parametrize(("mode", "env", "want"), [
    ("auto", {}, False),
    ("auto", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ("auto", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ("auto", {"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ("auto", {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
    ("auto", {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ("on", {}, True),
    ("off", {"OTEL_TRACES_EXPORTER": "otlp"}, False),
])
def test_when_tracing_is_on(mode: str, env: dict[str, str], want: bool) -> None:
    assert tracing.wanted(mode, env) is want


def test_the_otlp_exporter_comes_from_the_environment() -> None:
    traces = tracing.from_env("auto", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert traces is not None
    try:
        processors = traces.provider._active_span_processor._span_processors
        assert type(processors[0].span_exporter).__name__ == "OTLPSpanExporter"
    finally:
        traces.shutdown()


def test_the_console_exporter_writes_one_json_line_per_span(
        capsys: pytest.CaptureFixture[str]) -> None:
    traces = tracing.from_env("auto", {"OTEL_TRACES_EXPORTER": "console"})
    assert traces is not None
    traces.tracer.start_span("chat demo").end()
    traces.shutdown()
    # (structlog, unconfigured in tests, prints its own lines to stdout too)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert [json.loads(line)["name"] for line in lines] == ["chat demo"]


def test_the_gateway_serves_without_opentelemetry_installed() -> None:
    """The `otel` extra is optional: with its modules unimportable the app builds, tracing
    asked for is refused with a warning, and trace context still reaches the worker."""
    code = f"""
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import asyncio, httpx, orjson, respx
from gateway import telemetry, tracing
assert telemetry.otel is None
assert tracing.from_env("on", {{}}) is None
from tests.unit import test_metrics as t

async def main(r):
    s = t.Scraper(r)
    async with s.app.router.lifespan_context(s.app), s.client:
        return await s.client.post("/v1/chat/completions", headers={{"traceparent": "{TRACEPARENT}"}},
                                   content=orjson.dumps({{**t.CHAT, "stream": True}}))

with respx.mock(assert_all_called=False) as r:
    r.post(url__startswith="http://up").mock(return_value=httpx.Response(
        200, content=t.STREAM_USAGE, headers={{"content-type": "text/event-stream"}}))
    resp = asyncio.run(main(r))
    assert resp.status_code == 200, resp.text
    assert r.calls.last.request.headers["traceparent"] == "{TRACEPARENT}"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")


@pytest.mark.anyio
async def test_each_continuation_of_a_cut_stream_has_its_own_client_span() -> None:
    """n=2 cut after its first byte: each choice is continued by a request of its own, at
    once (gateway.failover). Every worker request has its own attempt span, ended (an open
    one is never exported), and names that span in its `traceparent`."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    from tests.unit import test_pipeline_respx as harness
    with respx.mock(assert_all_called=True) as r:
        harness.healthy(r)
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=harness.Broken([TWO_CHOICES_HEAD])))
        r.post(f"{UP2}/v1/chat/completions").mock(
            side_effect=lambda _: httpx.Response(200, content=REST))
        resp = await post(r, {**CHAT, "stream": True, "n": 2, "max_tokens": 10},
                          {"traceparent": TRACEPARENT}, tracing.Tracing.of(provider))
        seen = [q for q in worker_saw(r) if q.method == "POST"]
    assert resp.status_code == 200 and '"error"' not in resp.text
    attempts = [s for s in exporter.get_finished_spans() if s.kind == trace.SpanKind.CLIENT]
    assert len(seen) == len(attempts) == 3
    assert sorted(q.headers["traceparent"] for q in seen) == sorted(
        f"00-{TRACE_ID}-{a.context.span_id:016x}-01" for a in attempts)
    errors = [dict(a.attributes or {}).get("error.type") for a in attempts
              if a.status.status_code == trace.StatusCode.ERROR]
    assert errors == ["UpstreamBroken"]
