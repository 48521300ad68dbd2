"""The pipeline at the upstream seam, with respx-mocked workers: retries before the first
byte, refusals, in-band errors after it, and the error bodies clients get."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import respx

from gateway import app as gateway_app
from gateway import config, upstream, upstream_clients

UP1, UP2 = "http://up1:8000", "http://up2:8000"
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "Hi"}]}
SSE_OK = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":null}]}\n\n'
    b"data: [DONE]\n\n"
)
WHOLE_OK = orjson.dumps({
    "id": "c", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                 "finish_reason": "stop", "stop_reason": None}],
    "usage": {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1}})
# WHOLE_OK as its stream: a whole answer that may be long is asked as one (gateway.whole)
SSE_WHOLE = SSE_OK.removesuffix(b"data: [DONE]\n\n") + (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n")


def worker_ok(request: httpx.Request) -> httpx.Response:
    """The worker's answer "Hello" in the form the gateway asked for: one body, or its stream
    (a whole answer with no small `max_tokens` is asked as a stream and folded)."""
    if orjson.loads(request.content).get("stream"):
        return httpx.Response(200, content=SSE_WHOLE,
                              headers={"content-type": "text/event-stream"})
    return httpx.Response(200, content=WHOLE_OK)


class Reads(httpx.AsyncByteStream):
    """A worker body that comes in `parts`, one read each (one batch of events each)."""

    def __init__(self, parts: list[bytes]):
        self.parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for p in self.parts:
            yield p


class Broken(Reads):
    """A worker body that sends `parts` and then breaks off."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for p in self.parts:
            yield p
        raise httpx.ReadError("connection reset by peer")


def make_config(**server: Any) -> config.Config:
    return config.Config.model_validate({
        "server": server, "default_model": "demo",
        "models": [{"name": "demo", "aliases": ["d"], "backend": "vllm",
                    "upstreams": [UP1, UP2], "upstream_model": "org/model",
                    "routing": "round_robin"}]})


def healthy(router: respx.MockRouter) -> None:
    """Every worker passes its health probe: static upstreams are probed as the gateway starts,
    and /health counts none before its probe passed."""
    router.get(path__regex=r"/(health|v2/health/ready|v1/models)$").mock(
        return_value=httpx.Response(200))


async def probed(app: Any) -> None:
    """Until the gateway `app` has the first probe's verdict on every static upstream (bounded):
    they are probed as it starts, and /health and the health gauge count none before that."""
    routes = app.state.services.router.routes.values()
    async with asyncio.timeout(5):
        while any(route.upstreams.pending() for route in routes):
            await asyncio.sleep(0.01)


async def call(router: respx.MockRouter, body: dict[str, Any] | bytes,
               cfg: config.Config | None = None, headers: dict[str, str] | None = None,
               path: str = "/v1/chat/completions") -> httpx.Response:
    def factory(_: config.Config) -> upstream.UpstreamClient:
        return upstream_clients.HttpxClient(httpx.AsyncClient(transport=httpx.MockTransport(
            router.async_handler)))

    app = gateway_app.build_app(cfg or make_config(), factory)
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw") as client:
            return await client.post(path, content=content, headers=headers or {})


@pytest.mark.anyio
async def test_connect_failure_on_first_upstream_is_retried_on_second() -> None:
    with respx.mock(assert_all_called=True) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
        ok = r.post(f"{UP2}/v1/chat/completions").mock(side_effect=worker_ok)
        resp = await call(r, CHAT)
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == "Hello"
    assert orjson.loads(ok.calls.last.request.content)["model"] == "org/model"


@pytest.mark.anyio
async def test_worker_503_before_first_byte_is_retried_and_stream_succeeds() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            503, json={"error": {"message": "busy", "type": "ServiceUnavailableError",
                                 "param": None, "code": 503}}))
        r.post(f"{UP2}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=SSE_OK, headers={"content-type": "text/event-stream"}))
        resp = await call(r, {**CHAT, "stream": True})
    assert resp.status_code == 200
    assert resp.text.endswith("data: [DONE]\n\n")
    assert '"content":"Hello"' in resp.text


@pytest.mark.anyio
async def test_all_upstreams_down_gives_503_in_openai_error_body() -> None:
    with respx.mock(assert_all_called=False) as r:
        down = r.post(url__startswith="http://up").mock(
            side_effect=httpx.ConnectError("refused"))
        resp = await call(r, {**CHAT, "stream": True})
    assert resp.status_code == 503
    err = resp.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "upstream_unavailable"
    assert set(err) == {"message", "type", "param", "code"}
    assert down.call_count == 3  # one attempt and two bounded retries


@pytest.mark.anyio
async def test_worker_5xx_everywhere_gives_502() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(url__startswith="http://up").mock(return_value=httpx.Response(500, text="boom"))
        resp = await call(r, CHAT)
    assert resp.status_code == 502
    assert resp.json()["error"]["message"] == "the worker answered HTTP 500"  # body: log only


@pytest.mark.anyio
async def test_worker_4xx_is_passed_on_and_never_retried() -> None:
    with respx.mock(assert_all_called=False) as r:
        first = r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            400, json={"error": {"message": "bad `top_k`", "type": "BadRequestError",
                                 "param": None, "code": 400}}))
        second = r.post(f"{UP2}/v1/chat/completions").mock(return_value=httpx.Response(200))
        resp = await call(r, CHAT)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "bad `top_k`"
    assert first.call_count == 1 and second.call_count == 0


@pytest.mark.anyio
async def test_mid_stream_break_ends_with_in_band_error_not_silence() -> None:
    head = SSE_OK.split(b"\n\n")[0] + b"\n\n" + SSE_OK.split(b"\n\n")[1] + b"\n\n"
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=Broken([head])))
        resp = await call(r, {**CHAT, "stream": True}, make_config(failover_attempts=0))
    assert resp.status_code == 200
    events = [e for e in resp.text.split("\n\n") if e]
    assert '"content":"Hello"' in events[1]
    error = orjson.loads(events[-2].removeprefix("data: "))
    assert error["error"]["type"] == "server_error"
    assert "broke off" in error["error"]["message"]
    assert events[-1] == "data: [DONE]"


@pytest.mark.anyio
async def test_stream_that_ends_without_done_is_an_error() -> None:
    cut = SSE_OK.replace(b"data: [DONE]\n\n", b"")
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(200, content=cut))
        resp = await call(r, {**CHAT, "stream": True}, make_config(failover_attempts=0))
    assert resp.status_code == 200
    assert "[DONE]" in resp.text and "before `data: [DONE]`" in resp.text


@pytest.mark.anyio
async def test_request_id_goes_upstream_and_comes_back() -> None:
    with respx.mock(assert_all_called=False) as r:
        route = r.post(f"{UP1}/v1/chat/completions").mock(side_effect=worker_ok)
        resp = await call(r, CHAT, headers={"x-request-id": "abc-123"})
    assert resp.headers["x-request-id"] == "abc-123"
    assert route.calls.last.request.headers["x-request-id"] == "abc-123"


@pytest.mark.anyio
@pytest.mark.parametrize(("body", "status", "param"), [
    (b"{not json", 400, None),
    ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ({"model": "demo", "messages": []}, 400, "messages"),
    ({"model": "demo", "messages": [{"role": "user", "content": "x"}], "temperature": 5}, 400,
     "temperature"),
    ({"model": "demo", "messages": [{"role": "user", "content": "x"}],
      "stream_options": {"include_usage": True}}, 400, "stream_options"),
])
async def test_bad_requests_get_4xx_naming_the_field(body: Any, status: int,
                                                     param: str | None) -> None:
    with respx.mock(assert_all_called=False) as r:
        anything = r.route().mock(return_value=httpx.Response(200))
        resp = await call(r, body)
        assert anything.call_count == 0
    assert resp.status_code == status
    assert resp.json()["error"]["param"] == param


@pytest.mark.anyio
async def test_body_over_limit_is_413() -> None:
    with respx.mock(assert_all_called=False) as r:
        resp = await call(r, {**CHAT, "pad": "x" * 2000}, make_config(max_request_bytes=1000))
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"


@pytest.mark.anyio
async def test_api_keys_are_enforced() -> None:
    cfg = make_config(api_keys=["k1"])
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(side_effect=worker_ok)
        denied = await call(r, CHAT, cfg)
        allowed = await call(r, CHAT, cfg, headers={"authorization": "Bearer k1"})
        also = await call(r, CHAT, cfg, headers={"x-api-key": "k1"})
    assert denied.status_code == 401
    assert allowed.status_code == 200 and also.status_code == 200


@pytest.mark.anyio
async def test_alias_resolves_and_the_client_sees_its_own_model_name() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(side_effect=worker_ok)
        resp = await call(r, {**CHAT, "model": "d"})
    assert resp.status_code == 200 and resp.json()["model"] == "d"


@pytest.mark.anyio
@pytest.mark.parametrize("name", [None, "tgi", "dummy"])
async def test_placeholder_and_missing_model_names_reach_the_default_model(
        name: str | None) -> None:
    """TGI clients send "tgi" (text-generation) or "dummy" (huggingface_hub) or no model."""
    body: dict[str, Any] = {"messages": CHAT["messages"]}
    if name is not None:
        body["model"] = name
    with respx.mock(assert_all_called=False) as r:
        route = r.post(f"{UP1}/v1/chat/completions").mock(side_effect=worker_ok)
        resp = await call(r, body)
    assert resp.status_code == 200
    assert orjson.loads(route.calls.last.request.content)["model"] == "org/model"


@pytest.mark.anyio
async def test_status_routes_and_their_auth() -> None:
    def factory(_: config.Config) -> upstream.UpstreamClient:
        return upstream_clients.HttpxClient(httpx.AsyncClient())

    app = gateway_app.build_app(make_config(api_keys=["k"]), factory)
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        async with app.router.lifespan_context(app):
            await probed(app)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://gw") as client:
                health = await client.get("/health")
                denied = await client.get("/v1/models")
                models = await client.get("/v1/models", headers={"authorization": "Bearer k"})
    assert health.status_code == 200 and health.content == b""
    assert denied.status_code == 401
    assert [m["id"] for m in models.json()["data"]] == ["demo", "d"]


class Stalls(httpx.AsyncByteStream):
    """A worker body that sends `parts` and then goes silent."""

    def __init__(self, parts: list[bytes]):
        self.parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for p in self.parts:
            yield p
        await asyncio.sleep(30)


@pytest.mark.anyio
async def test_a_silent_worker_ends_the_stream_with_an_idle_timeout_error() -> None:
    head = b"\n\n".join(SSE_OK.split(b"\n\n")[:2]) + b"\n\n"
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=Stalls([head])))
        started = time.monotonic()
        resp = await call(r, {**CHAT, "stream": True},
                          make_config(timeouts={"idle": 0.3, "first_byte": 5},
                                      failover_attempts=0))
    assert time.monotonic() - started < 5
    events = [e for e in resp.text.split("\n\n") if e]
    assert '"content":"Hello"' in events[1]
    error = orjson.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "upstream_timeout" and "nothing for 0.3s" in error["message"]
    assert events[-1] == "data: [DONE]"


@pytest.mark.anyio
async def test_workers_silent_before_their_first_byte_are_a_504_each_asked_once() -> None:
    """A worker silent past `first_byte` is not asked again (the retries left, two, would
    have gone to UP1 again): the client waits one `first_byte` an upstream."""
    with respx.mock(assert_all_called=True) as r:
        silent = [r.post(f"{up}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=Stalls([]))) for up in (UP1, UP2)]
        started = time.monotonic()
        resp = await call(r, {**CHAT, "stream": True},
                          make_config(timeouts={"first_byte": 0.3}))
    assert resp.status_code == 504
    assert resp.json()["error"]["code"] == "upstream_timeout"
    assert [route.call_count for route in silent] == [1, 1]
    assert time.monotonic() - started < 5


@pytest.mark.anyio
async def test_a_worker_silent_before_its_first_byte_is_passed_over_for_another() -> None:
    """As nginx's default `proxy_next_upstream error timeout`: the stream comes from the
    worker that answers, and the silent one's connection is closed."""
    with respx.mock(assert_all_called=True) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=Stalls([])))
        ok = r.post(f"{UP2}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=SSE_OK, headers={"content-type": "text/event-stream"}))
        resp = await call(r, {**CHAT, "stream": True},
                          make_config(timeouts={"first_byte": 0.3}))
    assert resp.status_code == 200
    assert '"content":"Hello"' in resp.text and resp.text.endswith("data: [DONE]\n\n")
    assert ok.call_count == 1


@pytest.mark.anyio
async def test_a_lone_worker_silent_before_its_first_byte_is_asked_once() -> None:
    with respx.mock(assert_all_called=True) as r:
        silent = r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=Stalls([])))
        cfg = config.Config.model_validate({  # validated: model_copy would keep a list
            "server": {"timeouts": {"first_byte": 0.3}}, "default_model": "demo",
            "models": [{"name": "demo", "backend": "vllm", "upstreams": [UP1]}]})
        resp = await call(r, {**CHAT, "stream": True}, cfg)
    assert resp.status_code == 504
    assert silent.call_count == 1


@pytest.mark.anyio
async def test_text_in_the_read_of_an_in_band_error_reaches_the_client_first() -> None:
    """vLLM writes its text and its mid-stream `{"error"}` event back to back (wire-formats.md
    3.5), so one read may hold both: the client gets the text, then the error, in band."""
    error = b'data: {"error": {"message": "engine died", "type": "InternalServerError", ' \
        b'"param": null, "code": 500}}\n\n'
    body = b"\n\n".join(SSE_OK.split(b"\n\n")[:2]) + b"\n\n" + error + b"data: [DONE]\n\n"
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=httpx.ByteStream(body)))
        resp = await call(r, {**CHAT, "stream": True}, make_config(failover_attempts=0))
    assert resp.status_code == 200
    events = [e for e in resp.text.split("\n\n") if e]
    assert '"content":"Hello"' in events[1]
    assert "engine died" in orjson.loads(events[-2].removeprefix("data: "))["error"]["message"]
    assert events[-1] == "data: [DONE]"


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [
    b"data: {not json\n\n",
    b'data: {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}\n\n',
], ids=["malformed", "error-event"])
async def test_a_bad_event_read_with_text_ends_the_stream_without_waiting(bad: bytes) -> None:
    """A worker that writes text and then a malformed or error event in one read, and then
    nothing (no `[DONE]`, connection open): the client gets the text, then the in-band error
    at once, not after `timeouts.idle` with a message about silence."""
    head = b"\n\n".join(SSE_OK.split(b"\n\n")[:2]) + b"\n\n"
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=Stalls([head + bad])))
        started = time.monotonic()
        resp = await call(r, {**CHAT, "stream": True},
                          make_config(timeouts={"idle": 20, "first_byte": 20},
                                      failover_attempts=0))
    assert time.monotonic() - started < 5
    events = [e for e in resp.text.split("\n\n") if e]
    assert '"content":"Hello"' in events[1]
    error = orjson.loads(events[-2].removeprefix("data: "))["error"]
    assert "nothing for" not in error["message"]
    assert events[-1] == "data: [DONE]"


@pytest.mark.anyio
async def test_a_dns_named_upstream_is_asked_with_its_name_as_host() -> None:
    """`http://localhost:8000` is expanded to the address it resolves to (gateway.resolver);
    the request to that address names the configured host, as nginx's `proxy_pass` to a name
    does: it named the bare address, which a name-based ingress in front of workers refuses."""
    cfg = config.Config.model_validate({
        "default_model": "demo",
        "models": [{"name": "demo", "backend": "vllm", "upstreams": ["http://localhost:8000"]}]})
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        by_name = r.post("http://localhost:8000/v1/chat/completions").mock(side_effect=worker_ok)
        by_address = r.post("http://127.0.0.1:8000/v1/chat/completions").mock(
            side_effect=worker_ok)
        app = gateway_app.build_app(cfg, lambda _: upstream_clients.HttpxClient(httpx.AsyncClient(
            transport=httpx.MockTransport(r.async_handler))))
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://gw") as client:
                for _ in range(100):  # until the name is resolved (in the background)
                    resp = await client.post("/v1/chat/completions", json=CHAT)
                    assert resp.status_code == 200
                    if by_address.called:
                        break
                    await asyncio.sleep(0.02)
    assert by_address.calls.last.request.headers["host"] == "localhost:8000"
    assert all(c.request.headers["host"] == "localhost:8000" for c in by_name.calls)


@pytest.mark.anyio
@pytest.mark.parametrize("body", [
    Broken([b'{"id":"c",']),  # the connection reset inside the one body
    b"null",  # trtllm-serve's 200 when its executor fails (openai_server.py openai_chat)
], ids=["reset", "null"])
async def test_a_whole_body_that_fails_before_the_client_saw_a_byte_is_retried(
        body: Any) -> None:
    """A worker asked for one body (a small `max_tokens`: not asked as a stream) that fails
    while it is read: nothing reached the client, so another upstream is asked, as for a
    stream that fails before its first event (SPEC.md: a worker down before the first byte is
    retried on another upstream)."""
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        bad = r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, **({"stream": body} if isinstance(body, Broken) else {"content": body})))
        r.post(f"{UP2}/v1/chat/completions").mock(side_effect=worker_ok)
        resp = await call(r, {**CHAT, "max_tokens": 5})
    assert bad.call_count == 1
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == "Hello"


@pytest.mark.anyio
@pytest.mark.parametrize("failover", [0, 1])
async def test_a_whole_answer_cut_mid_way_that_cannot_be_continued_is_asked_again(
        failover: int) -> None:
    """A whole answer asked of the worker as a stream (gateway.whole) that breaks after some
    text, where no continuation can carry it on (`response_format`: continuation.plain; or
    `server.failover_attempts: 0`): nothing reached the client yet, so the request is asked
    again from its start on another upstream, as any failure before the client's first byte
    is (SPEC.md: retried on another upstream, bounded), never a 502 while another serves."""
    cut = SSE_OK.split(b"\n\n")[1] + b"\n\n"  # the worker's first text, then a reset

    def first(request: httpx.Request) -> httpx.Response:
        assert orjson.loads(request.content)["stream"] is True
        return httpx.Response(200, stream=Broken([cut]),
                              headers={"content-type": "text/event-stream"})

    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        bad = r.post(f"{UP1}/v1/chat/completions").mock(side_effect=first)
        good = r.post(f"{UP2}/v1/chat/completions").mock(side_effect=worker_ok)
        body = {**CHAT, "response_format": {"type": "json_object"}} if failover else CHAT
        resp = await call(r, body, make_config(failover_attempts=failover))
    assert (bad.call_count, good.call_count) == (1, 1)
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == "Hello"
    assert resp.json()["usage"]["completion_tokens"] == 1


@pytest.mark.anyio
async def test_a_whole_answer_cut_on_the_only_upstream_is_the_workers_failure() -> None:
    """The same cut with no other upstream: the worker's failure (502) is the answer, not a
    503 for want of another upstream to ask, and the worker is asked once."""
    cut = SSE_OK.split(b"\n\n")[1] + b"\n\n"
    cfg = config.Config.model_validate({
        "server": {"failover_attempts": 0}, "default_model": "demo",
        "models": [{"name": "demo", "backend": "vllm", "upstreams": [UP1]}]})
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        bad = r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=Broken([cut]), headers={"content-type": "text/event-stream"}))
        resp = await call(r, CHAT, cfg)
    assert bad.call_count == 1
    assert resp.status_code == 502
    assert resp.json()["error"]["message"] == upstream.BROKE_OFF
