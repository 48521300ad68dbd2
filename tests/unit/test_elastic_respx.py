"""The Elastic routes through the real app, with the worker mocked at the upstream seam: the
framing setting, headers on every answer, errors before the stream (SSE with the status) and
after it (`event: error`, no [DONE]), the REST layer's JSON errors, and what the worker is sent."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from adapters.frontends import elastic_encode as enc
from gateway import config
from tests.unit import test_pipeline_respx as harness
from tests.unit.test_elastic_target import check_stream

UP = f"{harness.UP1}/v1/chat/completions"
CHAT = "/_inference/chat_completion/demo/_stream"
BODY = {"messages": [{"role": "user", "content": "Hi"}]}
SSE_HEADERS = {"content-type": "text/event-stream"}


def cfg(framing: str = "documented", **server: Any) -> config.Config:
    base = harness.make_config(**server).model_dump()
    return config.Config.model_validate({**base, "elastic": {"framing": framing}})


def events(body: bytes) -> list[tuple[bytes, bytes]]:
    """(event line, data) per event."""
    out = []
    for block in body.split(b"\n\n")[:-1]:
        name, data = block.split(b"\n")
        out.append((name, data.removeprefix(b"data: ")))
    return out


async def post(r: respx.MockRouter, path: str, body: Any = BODY, conf: config.Config | None = None,
               headers: dict[str, str] | None = None) -> httpx.Response:
    return await harness.call(r, body, conf or cfg(), {"content-type": "application/json",
                                                       **(headers or {})}, path)


@pytest.mark.anyio
@pytest.mark.parametrize("path", [CHAT, "/_inference/chat_completion/demo/_unified",
                                  "/_inference/d/_unified", "/_inference/demo/_stream"])
async def test_every_chat_path_streams(path: str) -> None:
    with respx.mock(assert_all_called=False) as r:
        route = r.post(UP).mock(return_value=httpx.Response(200, content=harness.SSE_OK,
                                                            headers=SSE_HEADERS))
        resp = await post(r, path)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.headers["x-elastic-product"] == "Elasticsearch"
    got = events(resp.content)
    assert got[-1] == (b"event: message", b"[DONE]")
    chunks = [orjson.loads(d)["chat_completion"] for _, d in got[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == "Hello"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 1
    sent = orjson.loads(route.calls.last.request.content)
    assert sent["stream"] is True and sent["model"] == "org/model"


@pytest.mark.anyio
async def test_server_framing_is_the_bytes_elasticsearch_writes() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(UP).mock(return_value=httpx.Response(200, content=harness.SSE_OK,
                                                    headers=SSE_HEADERS))
        resp = await post(r, CHAT, conf=cfg("server"))
    got = events(resp.content)
    assert all(name == enc.BOM + b"event: message" for name, _ in got)
    chunk = orjson.loads(got[1][1])
    assert list(chunk) == ["id", "choices", "model", "object"]  # no `created`, no wrapper
    # What an Elasticsearch consumer of its own bytes reads: a WHATWG parser keeps the BOM in
    # the field name after the first event, so the data lines are what carry the chunks.
    assert check_stream(resp.content.replace(enc.BOM, b""), "parser")


@pytest.mark.anyio
async def test_worker_refusal_before_the_stream_is_sse_with_its_status() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(UP).mock(return_value=httpx.Response(400, json={"error": {
            "message": "bad `top_p`", "type": "BadRequestError", "param": None, "code": 400}}))
        resp = await post(r, CHAT)
    assert resp.status_code == 400
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.headers["x-elastic-product"] == "Elasticsearch"
    name, data = events(resp.content)[0]
    assert name == b"event: error"
    assert orjson.loads(data) == {"error": {"code": "bad_request", "message": "bad `top_p`",
                                            "type": "status_exception"}}


@pytest.mark.anyio
async def test_workers_down_is_503_sse() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(url__startswith="http://up").mock(side_effect=httpx.ConnectError("refused"))
        resp = await post(r, "/_inference/completion/demo/_stream", {"input": "x"})
    assert resp.status_code == 503
    (name, data), = events(resp.content)
    assert name == b"event: error"
    assert orjson.loads(data)["error"]["type"] == "status_exception"
    assert orjson.loads(data)["status"] == 503


@pytest.mark.anyio
async def test_mid_stream_break_is_an_error_event_and_no_done() -> None:
    head = b"".join(p + b"\n\n" for p in harness.SSE_OK.split(b"\n\n")[:2])
    with respx.mock(assert_all_called=False) as r:
        r.post(UP).mock(return_value=httpx.Response(200, stream=harness.Broken([head])))
        resp = await post(r, CHAT, conf=cfg(failover_attempts=0))
    assert resp.status_code == 200
    got = events(resp.content)
    assert got[-1][0] == b"event: error" and b"[DONE]" not in resp.content
    assert orjson.loads(got[-1][1])["error"]["code"] == "stream_error"


@pytest.mark.anyio
async def test_completion_json_route_end_to_end() -> None:
    with respx.mock(assert_all_called=False) as r:
        route = r.post(UP).mock(side_effect=harness.worker_ok)
        resp = await post(r, "/_inference/completion/d", {"input": "Hi"})
        missing = await post(r, "/_inference/completion/nope", {"input": "Hi"})
    assert resp.status_code == 200 and resp.json() == {"completion": [{"result": "Hello"}]}
    assert resp.headers["x-elastic-product"] == "Elasticsearch"
    assert orjson.loads(route.calls.last.request.content)["messages"] == [
        {"role": "user", "content": "Hi"}]
    assert missing.status_code == 404 and missing.headers["x-elastic-product"] == "Elasticsearch"
    assert missing.json()["error"]["type"] == "resource_not_found_exception"


@pytest.mark.anyio
async def test_api_keys_rest_layer_json_and_elastics_apikey_scheme() -> None:
    conf = cfg(api_keys=["k1"])
    with respx.mock(assert_all_called=False) as r:
        r.post(UP).mock(return_value=httpx.Response(200, content=harness.SSE_OK,
                                                    headers=SSE_HEADERS))
        denied = await post(r, CHAT, conf=conf)
        allowed = await post(r, CHAT, conf=conf, headers={"authorization": "ApiKey k1"})
    assert denied.status_code == 401 and denied.headers["content-type"] == "application/json"
    assert denied.headers["x-elastic-product"] == "Elasticsearch"
    assert denied.json()["error"]["type"] == "security_exception"
    assert allowed.status_code == 200


@pytest.mark.anyio
async def test_body_over_limit_is_413_json() -> None:
    with respx.mock(assert_all_called=False) as r:
        resp = await post(r, CHAT, {**BODY, "pad": "x" * 2000},
                          conf=cfg(max_request_bytes=1000))
    assert resp.status_code == 413 and resp.json()["status"] == 413
    assert resp.headers["x-elastic-product"] == "Elasticsearch"


@pytest.mark.anyio
async def test_bad_requests_never_reach_the_worker() -> None:
    with respx.mock(assert_all_called=False) as r:
        anything = r.route().mock(return_value=httpx.Response(200))
        unknown = await post(r, CHAT, {**BODY, "max_tokens": 3})
        wrong_type = await post(r, CHAT, headers={"content-type": "text/plain"})
        assert anything.call_count == 0
    assert unknown.status_code == 400 and unknown.content.startswith(b"event: error\n")
    assert wrong_type.status_code == 406 and wrong_type.json()["status"] == 406


@pytest.mark.anyio
async def test_chat_completion_without_stream_is_a_whole_json_answer() -> None:
    """POST _inference/chat_completion/{id} (Elasticsearch 9.6, PR #158022): the answer is one
    JSON chat completion in Elasticsearch's chunk shape (`message`, no `created`), with the
    product header. With no `max_completion_tokens` the worker is asked for a stream, which is
    folded (gateway.whole)."""
    with respx.mock(assert_all_called=False) as r:
        route = r.post(UP).mock(side_effect=harness.worker_ok)
        resp = await post(r, "/_inference/chat_completion/demo")
        missing = await post(r, "/_inference/chat_completion/nope")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["x-elastic-product"] == "Elasticsearch"
    body = resp.json()
    assert list(body) == ["id", "choices", "model", "object", "usage"]
    assert body["object"] == "chat.completion" and body["model"] == "demo"
    assert body["choices"] == [{"message": {"content": "Hello", "role": "assistant"},
                                "finish_reason": "stop", "index": 0}]
    assert orjson.loads(route.calls.last.request.content)["stream"] is True
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
