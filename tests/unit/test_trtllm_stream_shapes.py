"""trtllm-serve's own stream shapes, as the gateway reads them.

Source: NVIDIA/TensorRT-LLM tensorrt_llm/serve/postprocess_handlers.py
chat_stream_post_processor: with a named `tool_choice` every delta is
`DeltaMessage(tool_calls=[DeltaToolCall(function=DeltaFunctionCall(name=<the named function>,
arguments=<text>), index=i)])`, so the function's name comes again on every fragment, with no
`id` (DeltaToolCall.id defaults to None, dropped by `model_dump_json(exclude_none=True)`), and
the choice ends with "stop" (has_tool_call is set only by the tool parser's branch).
"""

from __future__ import annotations

import httpx
import orjson
import pytest

from adapters import registry
from schemas import canonical
from schemas import events as ev
from tests.fakes import trtllm_fake
from tests.fakes import trtllm_shapes as shapes
from tests.unit.test_openai_backend_params import chat

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _chunk(choice: dict[str, object]) -> bytes:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"


def _named(arguments: str, finish: str | None = None) -> bytes:
    call = {"type": "function", "index": 0,
            "function": {"name": "get_weather", "arguments": arguments}}
    choice: dict[str, object] = {"index": 0, "delta": {"tool_calls": [call]}}
    if finish is not None:
        choice["finish_reason"] = finish
    return _chunk(choice)


NAMED_STREAM = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant"}}]} \n\n'
    + _named('{"city":') + _named(' "Paris"}') + _named("", "stop") + b"data: [DONE]\n\n")


def test_a_named_tool_calls_repeated_name_is_one_name() -> None:
    """The name that trtllm-serve repeats on every fragment of a named tool call is the
    call's name once: the events carry it on the first fragment only (as vLLM and OpenAI
    stream it), so neither the folded answer nor a client's own accumulation of the deltas
    (openai-python's stream state adds up string fields) reads it three times."""
    req = chat(stream=True, tools=TOOLS, tool_choice=NAMED)
    dec = registry.backend("trtllm").decoder(req, streaming=True)
    events = dec.feed(NAMED_STREAM) + dec.close()
    calls = [e for e in events if isinstance(e, ev.ToolCallDelta)]
    assert [c.name for c in calls] == ["get_weather", None, None]
    done = canonical.Completion.fold(events)
    [call] = done.choices[0].tool_calls
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')


@pytest.mark.anyio
async def test_the_fake_cuts_a_failed_stream_as_trtllm_serve_does() -> None:
    """trtllm-serve's chat_stream_generator (openai_server.py) logs and re-raises a failure:
    the connection is cut, with no error event and no `[DONE]` (the gateway's side of that,
    a stream ended before `[DONE]`, is OpenAIDecoder.on_end). The fake raises where the
    simulator would write vLLM's error event; httpx's ASGITransport hands that on."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=trtllm_fake.app()),
                                 base_url="http://t") as client:
        with pytest.raises(shapes.StreamCut):
            await client.post("/v1/chat/completions", json={
                "model": "m", "stream": True, "max_tokens": 8,
                "messages": [{"role": "user", "content": "Hi [[sim error_after=2]]"}]})
