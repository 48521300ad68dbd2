"""No mass assignment (issue 12): only the fields a worker's protocol declares go upstream
(per-worker allow-lists: openai.OPENAI_EXTRA_FIELDS, vllm.VLLM_EXTRA_FIELDS,
trtllm.TRTLLM_EXTRA_FIELDS; Triton's and TGI's parameter tables drop unknown extras). A body's
`api_key`, `api_base`, `base_url`, `extra_headers` or `upstream_model` never reaches the worker
nor changes where the request goes, whatever client protocol carries it."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from gateway import config
from tests.unit.test_pipeline_respx import SSE_OK, WHOLE_OK, call

UP = "http://worker:8000"
HOSTILE: dict[str, Any] = {
    "api_key": "sk-stolen", "api_base": "http://evil:9", "base_url": "http://evil:9",
    "extra_headers": {"authorization": "Bearer sk-stolen", "x-target": "evil"},
    "upstream_model": "attacker/model",
}
CHAT = [{"role": "user", "content": "Hi"}]

# Client protocols whose bodies can carry extras: path and body.
CLIENTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"model": "m", "messages": CHAT}),
    ("/v1/completions", {"model": "m", "prompt": "Hi"}),
    ("/v1/chat/completions", {"model": "tgi", "messages": CHAT}),  # TGI's Messages API
    ("/invocations", {"messages": CHAT}),  # LMI chat
    ("/invocations", {"prompt": "Hi"}),  # LMI / SageMaker vLLM completion
]
IDS = ["openai-chat", "openai-completions", "tgi-messages", "lmi-chat", "lmi-prompt"]


def cfg(backend: str) -> config.Config:
    return config.Config.model_validate({
        "default_model": "m",
        "models": [{"name": "m", "backend": backend, "upstreams": [UP],
                    "upstream_model": "org/served"}]})


def worker_answer(request: httpx.Request) -> httpx.Response:
    chat = request.url.path.endswith("/chat/completions")
    body = WHOLE_OK if chat else orjson.dumps({
        "id": "c", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "text": "Hello", "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
    if orjson.loads(request.content).get("stream"):
        return httpx.Response(200, content=SSE_OK if chat else b"",
                              headers={"content-type": "text/event-stream"})
    return httpx.Response(200, content=body, headers={"content-type": "application/json"})


async def sent(backend: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response,
                                                                       list[httpx.Request]]:
    with respx.mock(assert_all_called=False) as r:
        r.get(host="worker", path__regex=r"^/(health|v1/models)$").mock(  # its probe
            return_value=httpx.Response(200))
        ours = r.route(host="worker").mock(side_effect=worker_answer)
        other = r.route().mock(return_value=httpx.Response(599))
        resp = await call(r, body, cfg(backend), path=path)
    assert other.call_count == 0  # nothing went anywhere but the configured upstream
    return resp, [c.request for c in ours.calls]


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["vllm", "openai"])
@pytest.mark.parametrize(("path", "body"), CLIENTS, ids=IDS)
async def test_hostile_fields_never_reach_the_worker(backend: str, path: str,
                                                     body: dict[str, Any]) -> None:
    resp, requests = await sent(backend, path, {**body, **HOSTILE})
    assert resp.status_code == 200, resp.text
    (request,) = requests
    upstream = orjson.loads(request.content)
    assert not set(HOSTILE) & set(upstream)
    assert upstream["model"] == "org/served"
    assert b"sk-stolen" not in request.content and b"evil" not in request.content
    assert "x-target" not in request.headers
    assert request.headers.get("authorization") is None


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body"), CLIENTS[:2], ids=IDS[:2])
async def test_trtllm_refuses_undeclared_fields_before_any_io(path: str,
                                                              body: dict[str, Any]) -> None:
    """trtllm-serve refuses unknown fields (extra="forbid"); the gateway says so first."""
    resp, requests = await sent("trtllm", path, {**body, "api_key": "sk-stolen"})
    assert resp.status_code == 400 and requests == []
    assert "`api_key`" in resp.json()["error"]["message"]


@pytest.mark.anyio
@pytest.mark.parametrize(("field", "value"), [("include_stop_str_in_output", True),
                                              ("chat_template_kwargs", {"thinking": False}),
                                              ("priority", 3)])
async def test_fields_vllm_declares_still_reach_it(field: str, value: Any) -> None:
    resp, (request,) = await sent("vllm", "/v1/chat/completions",
                                  {"model": "m", "messages": CHAT, field: value, **HOSTILE})
    assert resp.status_code == 200
    upstream = orjson.loads(request.content)
    assert upstream[field] == value and not set(HOSTILE) & set(upstream)


@pytest.mark.anyio
async def test_vllm_only_fields_do_not_reach_a_plain_openai_server() -> None:
    _, (request,) = await sent("openai", "/v1/chat/completions",
                               {"model": "m", "messages": CHAT, "chat_template_kwargs": {}})
    assert "chat_template_kwargs" not in orjson.loads(request.content)


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body", "field"), [
    (CLIENTS[1][0], CLIENTS[1][1], "chat_template_kwargs"),
    (CLIENTS[1][0], CLIENTS[1][1], "documents"),
    (CLIENTS[0][0], CLIENTS[0][1], "detokenize"),
])
async def test_trtllm_refuses_a_field_only_its_other_route_declares(
        path: str, body: dict[str, Any], field: str) -> None:
    """trtllm-serve openai_protocol.py: ChatCompletionRequest and CompletionRequest each
    forbid the other's own fields, so the gateway refuses them per route, before any I/O."""
    resp, requests = await sent("trtllm", path, {**body, field: {} if field != "detokenize"
                                                 else False})
    assert resp.status_code == 400 and requests == []
    assert resp.json()["error"]["message"] == \
        f"`{field}` is not supported by this model's worker (trtllm-serve)"
