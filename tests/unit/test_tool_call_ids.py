"""Every tool call a client reads has an id, streamed or whole, whatever the worker sent.

Sources: NVIDIA/TensorRT-LLM tensorrt_llm/serve/postprocess_handlers.py
chat_stream_post_processor (a named `tool_choice`'s fragments: DeltaToolCall with no `id`);
openai-python src/openai/types/chat/chat_completion_message_tool_call.py (`id: str`, which the
client sends back as the tool message's `tool_call_id`); vllm-project/vllm
vllm/entrypoints/openai/chat_completion/serving.py (every call gets an id, `chatcmpl-tool-...`,
on its first fragment only, as OpenAI streams it). The made id is `call_<response id>_<choice>_
<index>` (adapters/base.py ResponseMeta.call_id), deterministic as STYLE.md asks.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
import pytest
import respx
from openai.lib.streaming._deltas import accumulate_delta

from adapters import registry
from gateway import config
from schemas import events as ev
from tests.unit.test_openai_backend_params import chat
from tests.unit.test_pipeline_respx import UP1, UP2, call, healthy
from tests.unit.test_trtllm_stream_shapes import NAMED_STREAM

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
CHAT = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED, "max_tokens": 16}
# A whole answer whose call has no id (an OpenAI-compatible server that writes none).
WHOLE = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
         "choices": [{"index": 0, "finish_reason": "stop", "message": {
             "role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}
WITH_ID = NAMED_STREAM.replace(b'"index":0,"function":{"name"',
                               b'"id":"chatcmpl-tool-7","index":0,"function":{"name"', 1)

# (path, body) of each client protocol that renders tool calls, streamed and whole.
CLIENTS = {
    "openai-stream": ("/v1/chat/completions", {"model": "demo", "stream": True, **CHAT}),
    "openai-whole": ("/v1/chat/completions", {"model": "demo", **CHAT}),
    "tgi-stream": ("/v1/chat/completions", {"model": "tgi", "stream": True, **CHAT}),
    "tgi-whole": ("/v1/chat/completions", {"model": "tgi", **CHAT}),
    "lmi-stream": ("/invocations", {"stream": True, **CHAT}),
    "lmi-whole": ("/invocations", CHAT),
    "elastic-stream": ("/_inference/chat_completion/demo/_stream", {
        "messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED}),
    "elastic-whole": ("/_inference/chat_completion/demo", {
        "messages": MESSAGES, "tools": TOOLS, "tool_choice": NAMED}),
}
MADE = re.compile(r"call_[0-9a-f]{32}_0_0")


def _config() -> config.Config:
    return config.Config.model_validate({
        "default_model": "demo",
        "models": [{"name": "demo", "backend": "trtllm", "upstreams": [UP1, UP2],
                    "upstream_model": "org/model", "routing": "round_robin"}]})


def _worker(stream: bytes) -> Any:
    def answer(request: httpx.Request) -> httpx.Response:
        if orjson.loads(request.content).get("stream"):
            return httpx.Response(200, content=stream,
                                  headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=WHOLE)
    return answer


def _objects(body: bytes) -> list[Any]:
    """Every JSON value in a whole body, a JSON-lines body or an SSE body's `data:` lines."""
    out = []
    for line in body.splitlines():
        line = line.removeprefix(b"\xef\xbb\xbf").removeprefix(b"data:").strip()
        if line.startswith((b"{", b"[")) and line != b"[DONE]":
            out.append(orjson.loads(line))
    return out


def _calls(value: Any) -> list[dict[str, Any]]:
    """Each tool-call entry anywhere in `value`, in order."""
    if isinstance(value, list):
        return [c for v in value for c in _calls(v)]
    if not isinstance(value, dict):
        return []
    own = value.get("tool_calls")
    return ([c for c in own if isinstance(c, dict)] if isinstance(own, list) else []) + [
        c for k, v in value.items() if k != "tool_calls" for c in _calls(v)]


async def _answer(path: str, body: dict[str, Any], stream: bytes) -> tuple[httpx.Response,
                                                                           list[Any]]:
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        r.post(url__startswith="http://up").mock(side_effect=_worker(stream))
        resp = await call(r, body, cfg=_config(), path=path)
    assert resp.status_code == 200, resp.content
    return resp, _objects(resp.content)


@pytest.mark.anyio
@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_a_call_without_a_worker_id_gets_one(client: str) -> None:
    """trtllm-serve's named `tool_choice` stream (and a whole answer) carries no id: the
    client's first fragment of the call, or its whole call, has a made one; later fragments
    carry none (TGI's DeltaToolCall writes `""` there, lib.rs)."""
    path, body = CLIENTS[client]
    _, objects = await _answer(path, body, NAMED_STREAM)
    calls = _calls(objects)
    assert calls, objects
    first, rest = calls[0], calls[1:]
    assert MADE.fullmatch(first["id"]), first
    assert first["function"]["name"] == "get_weather"
    assert all(not c.get("id") for c in rest), rest
    response_ids = {o["id"] for o in objects if isinstance(o, dict) and o.get("id")}
    for rid in response_ids:  # TGI writes `"id": ""`; the others, the response's own id
        assert first["id"] == f"call_{rid.removeprefix('chatcmpl-')}_0_0"


@pytest.mark.anyio
@pytest.mark.parametrize("client", [c for c in sorted(CLIENTS) if c.endswith("stream")])
async def test_a_workers_own_id_is_kept(client: str) -> None:
    path, body = CLIENTS[client]
    _, objects = await _answer(path, body, WITH_ID)
    assert [c["id"] for c in _calls(objects) if c.get("id")] == ["chatcmpl-tool-7"]


def _tgi_fragment(arguments: str, name: str | None = None, finish: str | None = None) -> bytes:
    """One chunk of a TGI tool-call stream: chat.rs create_event_from_stream_token writes the
    call's id (server.rs: `chat.next_tool_call_id()`, the same for every fragment) and type on
    every fragment, its name on the first only."""
    call = {"index": 0, "id": "0", "type": "function",
            "function": {"name": name, "arguments": arguments}}
    choice: dict[str, Any] = {"index": 0, "delta": {"role": "assistant", "tool_calls": [call]},
                              "logprobs": None, "finish_reason": finish}
    return b"data: " + orjson.dumps({"object": "chat.completion.chunk", "id": "", "created": 1,
                                     "model": "m", "system_fingerprint": "3.3.7-native",
                                     "choices": [choice], "usage": None}) + b"\n\n"


TGI_STREAM = (_tgi_fragment("{", "get_weather") + _tgi_fragment('"city": "Paris"')
              + _tgi_fragment("}", finish="stop") + b"data: [DONE]\n\n")


def test_a_tgi_workers_repeated_id_is_given_once() -> None:
    """TGI (router/src/chat.rs create_event_from_stream_token, server.rs chat_completions)
    repeats a call's id on every fragment; the decoder gives it once, on the call's first
    fragment, as vLLM and OpenAI stream it, so an OpenAI client adding the deltas up
    (openai-python lib/streaming/_deltas.py accumulate_delta concatenates string fields)
    reads the id once, not once per fragment."""
    req = chat(stream=True, tools=TOOLS, tool_choice=NAMED)
    dec = registry.backend("tgi").decoder(req, streaming=True)
    calls = [e for e in dec.feed(TGI_STREAM) + dec.close() if isinstance(e, ev.ToolCallDelta)]
    assert [(c.id, c.name) for c in calls] == [("0", "get_weather"), (None, None), (None, None)]


@pytest.mark.anyio
async def test_an_id_on_every_fragment_reaches_an_openai_client_once() -> None:
    """A worker that sends the call's id on every fragment (TGI, above): the OpenAI client's
    deltas, added up as openai-python's ChatCompletionStreamState does (accumulate_delta),
    hold the worker's id itself, not the id repeated per fragment."""
    every = NAMED_STREAM.replace(b'"index":0,"function":{"name"',
                                 b'"id":"chatcmpl-tool-7","index":0,"function":{"name"')
    path, body = CLIENTS["openai-stream"]
    _, objects = await _answer(path, body, every)
    acc: dict[object, object] = {}
    for o in objects:
        for choice in o.get("choices") or ():
            acc = accumulate_delta(acc, choice["delta"])
    [call] = acc["tool_calls"]  # type: ignore[misc]
    assert (call["id"], call["function"]["name"]) == ("chatcmpl-tool-7", "get_weather")
