"""The gateway as an Elasticsearch inference target: what ES's `openai` (and `hugging_face`,
`amazon_sagemaker`) services send to an OpenAI-compatible `url`, and what their parsers demand
of the answer.

`check_stream` / `check_whole` are written from Elasticsearch's parsers, one rule per declared
field (ObjectParser ValueTypes: a `declareString` refuses JSON null, `...OrNull` takes it; all
use ignoreUnknownFields, so unknown fields pass):
- "processor": `services/openai/OpenAiUnifiedStreamingProcessor.ChatCompletionChunkParser`
  (8.19 / 9.x): `model` and `object` required strings, `usage` and `content` nullable,
  `tool_calls` an array (not null), tool call `id` / `type` / `arguments` strings.
- "parser": `OpenAiUnifiedChatCompletionParser` (current main): `model` / `object` optional,
  `tool_calls` nullable, `reasoning` a string, usage details.
- "legacy": `OpenAiStreamingProcessor`, the `completion` task's stream: `choices[].delta`
  objects whose `content`, when present, is a string (VALUE_STRING, never null).
The first version (PR #117589, `external/openai`) also refused `usage: null`, which OpenAI
itself sends on every chunk under include_usage (API reference), so it is not a target.
Non-streaming: `OpenAiChatCompletionResponseEntity` (choices[0].message.content a string).

The request bodies below are Elasticsearch's own, from its tests and request entities.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import httpx
import orjson
import pytest
import respx

from adapters import base
from adapters.frontends import openai as openai_frontend
from schemas import canonical
from tests.golden import runner
from tests.unit import test_pipeline_respx as harness

Generation = Literal["processor", "parser", "legacy"]
GENERATIONS: tuple[Generation, ...] = ("processor", "parser", "legacy")


class Refused(AssertionError):
    """Elasticsearch's parser would throw on this answer."""


# ---- bodies Elasticsearch sends (model "demo" stands for the endpoint's model_id) ----

# OpenAiUnifiedChatCompletionRequestEntityTests.testModelUserFieldsSerialization.
OPENAI_STREAM = {"messages": [{"content": "Hello, world!", "role": "user"}], "model": "demo",
                 "n": 1, "stream": True, "stream_options": {"include_usage": True},
                 "user": "a_user"}
# SimpleChatCompletionServiceIntegrationValidator: the "how big" call made when an endpoint is
# created; current code streams (UnifiedCompletionRequest.streaming), older code did not.
HOW_BIG_STREAM = {"messages": [{"content": "how big", "role": "user"}], "model": "demo", "n": 1,
                  "stream": True, "stream_options": {"include_usage": True}}
HOW_BIG_WHOLE = {"messages": [{"content": "how big", "role": "user"}], "model": "demo", "n": 1,
                 "stream": False}
# UnifiedChatCompletionRequestEntity with every field (messages, max_completion_tokens, n,
# stop, temperature, tool_choice, tools with a null description, top_p, stream), + `user`.
ALL_FIELDS = {
    "messages": [
        {"content": [{"text": "What's the price of a scarf?", "type": "text"}], "role": "user"},
        {"content": "Let me look", "role": "assistant",
         "tool_calls": [{"id": "call_1", "function": {"arguments": "{\"item\":\"scarf\"}",
                                                       "name": "get_current_price"},
                         "type": "function"}]},
        {"content": "12 EUR", "role": "tool", "tool_call_id": "call_1"}],
    "max_completion_tokens": 12, "n": 1, "stop": ["\n\n"], "temperature": 0.1,
    "tool_choice": {"type": "function", "function": {"name": "get_current_price"}},
    "tools": [{"type": "function", "function": {
        "description": None, "name": "get_current_price",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}}}}],
    "top_p": 0.2, "model": "demo", "stream": True, "stream_options": {"include_usage": True},
    "user": "a_user"}
# The legacy `completion` task (OpenAiChatCompletionRequestEntity, older ES).
LEGACY_COMPLETION = {"messages": [{"role": "user", "content": "abc"}], "model": "demo", "n": 1,
                     "user": "user"}
# HuggingFaceUnifiedChatCompletionRequestEntity: max_tokens, and no `model` when the endpoint
# has no model_id (HuggingFaceUnifiedChatCompletionRequestEntityTests).
HF_STREAM = {"messages": [{"content": "Hello, world!", "role": "user"}], "n": 1, "stream": True,
             "stream_options": {"include_usage": True}, "max_tokens": 8, "model": "demo"}
HF_NO_MODEL = {"messages": [{"content": "Hello, world!", "role": "user"}], "n": 1,
               "stream": False}
# SageMaker's openai schema (OpenAiCompletionPayload): no model; user; max_completion_tokens.
SAGEMAKER_STREAM = {"messages": [{"content": "how big", "role": "user"}], "n": 1, "stream": True,
                    "stream_options": {"include_usage": True}, "user": "u",
                    "max_completion_tokens": 8}

STREAMING = {"openai": OPENAI_STREAM, "how_big": HOW_BIG_STREAM, "all_fields": ALL_FIELDS,
             "legacy_stream": {**LEGACY_COMPLETION, "stream": True}, "hf": HF_STREAM}
WHOLE = {"how_big_whole": HOW_BIG_WHOLE, "legacy": LEGACY_COMPLETION}


# ---- the parser rules ----


def _kind(v: Any) -> str:
    if v is None:
        return "VALUE_NULL"
    if isinstance(v, bool):
        return "VALUE_BOOLEAN"
    if isinstance(v, int | float):
        return "VALUE_NUMBER"
    if isinstance(v, str):
        return "VALUE_STRING"
    return "START_ARRAY" if isinstance(v, list) else "START_OBJECT"


def _field(obj: dict[str, Any], parser: str, key: str, kinds: tuple[str, ...],
           required: bool = False) -> Any:
    """One declared field: absent (Required [key] if required) or of an accepted token."""
    if key not in obj:
        if required:
            raise Refused(f"[{parser}] Required [{key}]")
        return None
    value = obj[key]
    if _kind(value) not in kinds:
        raise Refused(f"[{parser}] {key} doesn't support values of type: {_kind(value)}")
    if kinds == INT and isinstance(value, str) and not value.lstrip("-").isdigit():
        raise Refused(f"[{parser}] failed to parse field [{key}]")
    return value


STRING = ("VALUE_STRING",)
STRING_OR_NULL = ("VALUE_STRING", "VALUE_NULL")
INT = ("VALUE_NUMBER", "VALUE_STRING")  # declareInt takes "3" too
OBJECT = ("START_OBJECT",)
OBJECT_OR_NULL = ("START_OBJECT", "VALUE_NULL")
ARRAY = ("START_ARRAY", "START_OBJECT")  # an array field takes one bare object too
ARRAY_OR_NULL = (*ARRAY, "VALUE_NULL")


def _items(value: Any) -> list[Any]:
    return [] if value is None else value if isinstance(value, list) else [value]


def check_chunk(chunk: Any, gen: Generation) -> None:
    """ChatCompletionChunkParser (processor) / STREAMING_PARSER (parser) on one chunk."""
    if not isinstance(chunk, dict):
        raise Refused("Failed to parse object: expecting token of type [START_OBJECT]")
    if gen == "legacy":
        return _check_legacy(chunk)
    root = "chat_completion_chunk"
    _field(chunk, root, "id", STRING, required=True)
    required = gen == "processor"
    _field(chunk, root, "model", STRING, required=required)
    _field(chunk, root, "object", STRING, required=required)
    for choice in _items(_field(chunk, root, "choices", ARRAY, required=True)):
        _check_choice(choice, gen)
    usage = _field(chunk, root, "usage", OBJECT_OR_NULL)
    if usage is not None:
        _check_usage(usage, gen)


def _check_legacy(chunk: dict[str, Any]) -> None:
    """OpenAiStreamingProcessor: `choices`, each with a `delta` object, a string `content`."""
    if not isinstance(chunk.get("choices"), list):
        raise Refused("Failed to find required field [choices] in OpenAI chat completions response")
    for choice in chunk["choices"]:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            raise Refused("Failed to find required field [delta] in OpenAI chat completions response")
        if "content" in delta and not isinstance(delta["content"], str):
            raise Refused(f"content is {_kind(delta['content'])}, expected VALUE_STRING")


def _check_choice(choice: dict[str, Any], gen: Generation) -> None:
    _field(choice, "choice", "finish_reason", STRING_OR_NULL)
    _field(choice, "choice", "index", INT, required=True)
    delta = _field(choice, "choice", "delta", OBJECT, required=True)
    _field(delta, "delta", "content", STRING_OR_NULL)
    _field(delta, "delta", "refusal", STRING_OR_NULL)
    _field(delta, "delta", "role", STRING)
    if gen == "parser":
        _field(delta, "delta", "reasoning", STRING)
    calls = _field(delta, "delta", "tool_calls", ARRAY if gen == "processor" else ARRAY_OR_NULL)
    for call in _items(calls):
        _field(call, "tool_call", "index", INT, required=True)
        _field(call, "tool_call", "id", STRING)
        _field(call, "tool_call", "type", STRING)
        fn = _field(call, "tool_call", "function", OBJECT)
        if fn is not None:
            _field(fn, "function", "arguments", STRING)
            _field(fn, "function", "name", STRING_OR_NULL)


def _check_usage(usage: dict[str, Any], gen: Generation) -> None:
    for key in ("completion_tokens", "prompt_tokens", "total_tokens"):
        _field(usage, "usage", key, INT, required=True)
    if gen == "parser":
        prompt = _field(usage, "usage", "prompt_tokens_details", OBJECT)
        if prompt is not None:
            _field(prompt, "prompt_tokens_details", "cached_tokens", INT)
        done = _field(usage, "usage", "completion_tokens_details", OBJECT_OR_NULL)
        if done is not None:
            _field(done, "completion_tokens_details", "reasoning_tokens", INT)


def sse_events(body: bytes) -> list[tuple[str, str]]:
    """(event type, data) per event, as ES's ServerSentEventParser reads them."""
    out = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        kind, data = "message", []
        for line in block.decode().split("\n"):
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                kind = value
            elif name == "data":
                data.append(value)
        if data:
            out.append((kind, "\n".join(data)))
    return out


def check_stream(body: bytes, gen: Generation) -> list[dict[str, Any]]:
    """The chunks ES would take from this SSE body; Refused where it would fail instead (an
    `event: error`, unparsable data, a rule above)."""
    chunks = []
    for kind, data in sse_events(body):
        if kind == "error":
            raise Refused(f"error event: {data}")
        if data.lower() == "[done]":  # DONE_MESSAGE.equalsIgnoreCase
            break
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise Refused(f"unparsable data: {data}") from exc
        check_chunk(chunk, gen)
        chunks.append(chunk)
    return chunks


def check_whole(body: bytes) -> str:
    """OpenAiChatCompletionResponseEntity.fromResponse: choices[0].message.content, a string."""
    obj = orjson.loads(body)
    try:
        content = obj["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise Refused(f"Failed to find required field: {exc}") from None
    if not isinstance(content, str):
        raise Refused(f"content is {_kind(content)}, not a string")
    return content


# ---- the rules bite where they should ----

NEW = ("processor", "parser")  # the unified chat parsers
GOOD = {"id": "c", "object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}


def _with_delta(delta: dict[str, Any]) -> dict[str, Any]:
    return {**GOOD, "choices": [{"index": 0, "delta": delta}]}


@pytest.mark.parametrize(("chunk", "refused_by"), [
    (GOOD, ()),
    ({**GOOD, "usage": None}, ()),
    ({k: v for k, v in GOOD.items() if k != "model"}, ("processor",)),
    ({k: v for k, v in GOOD.items() if k != "id"}, NEW),
    ({**GOOD, "choices": [{"delta": {}}]}, NEW),  # no index
    ({**GOOD, "choices": [{"index": 0}]}, GENERATIONS),  # no delta
    (_with_delta({"content": None}), ("legacy",)),
    (_with_delta({"tool_calls": None}), ("processor",)),
    (_with_delta({"role": None}), NEW),
    (_with_delta({"reasoning": None}), ("parser",)),
    (_with_delta({"tool_calls": [{"function": {"arguments": "{}"}}]}), NEW),
    (_with_delta({"tool_calls": [{"index": 0, "type": None}]}), NEW),
    (_with_delta({"tool_calls": [{"index": 0, "function": {"arguments": None}}]}), NEW),
    ({**GOOD, "usage": {"prompt_tokens": 1, "completion_tokens": 1}}, NEW),
])
def test_the_parser_rules(chunk: dict[str, Any], refused_by: tuple[str, ...]) -> None:
    for gen in GENERATIONS:
        if gen in refused_by:
            with pytest.raises(Refused):
                check_chunk(chunk, gen)
        else:
            check_chunk(chunk, gen)


def test_error_events_and_garbage_are_refused() -> None:
    with pytest.raises(Refused, match="error event"):
        check_stream(b'event: error\ndata: {"error":{}}\n\n', "parser")
    with pytest.raises(Refused, match="unparsable"):
        check_stream(b"data: {nope\n\n", "parser")
    assert check_stream(b"data: [done]\n\n", "parser") == []


# ---- the OpenAI front end's bytes, from its goldens, meet both parsers ----

OPENAI_GOLDENS = runner.ROOT / "openai"


def _golden_body(case: Path) -> bytes:
    return (case / "response.txt").read_bytes().partition(b"\n\n")[2]


@pytest.mark.parametrize("case", [p for p in runner.cases("openai")
                                  if p.name.startswith("chat_stream")], ids=lambda p: p.name)
def test_openai_chat_stream_goldens_meet_es_parsers(case: Path) -> None:
    """Every chat chunk the OpenAI front end writes is one ES takes: id, model and object in
    every chunk (the usage chunk too), no null content, int tool-call indexes, int usage. An
    in-band failure is a chunk ES cannot parse, which it reports as the error it is."""
    body = _golden_body(case)
    for gen in GENERATIONS:
        if case.name == "chat_stream_error":
            with pytest.raises(Refused):
                check_stream(body, gen)
            continue
        chunks = check_stream(body, gen)
        assert chunks and all({"id", "model", "object"} <= set(c) for c in chunks)


@pytest.mark.parametrize("case", ["chat_whole", "chat_whole_logprobs"])
def test_openai_chat_whole_goldens_meet_the_non_streaming_parser(case: str) -> None:
    assert check_whole(_golden_body(OPENAI_GOLDENS / case))


# ---- ES's request bodies are accepted as ES means them ----


def _translator(body: dict[str, Any]) -> base.Translator:
    ctx = base.RequestContext("/v1/chat/completions")
    return openai_frontend.OpenAIChatFrontend().parse(orjson.dumps(body), ctx)


def _parse(body: dict[str, Any]) -> canonical.InferenceRequest:
    return _translator(body).request


def test_es_openai_bodies_parse() -> None:
    t = _translator(OPENAI_STREAM)
    req = t.request
    assert (req.model, req.user, req.stream, req.include_usage) == ("demo", "a_user", True, True)
    assert req.sampling.n == 1
    assert isinstance(t, openai_frontend.ChatTranslator)  # plain OpenAI answers
    req = _parse(ALL_FIELDS)
    assert req.sampling.max_tokens == 12 and req.sampling.stop == ["\n\n"]
    assert req.tool_choice == "get_current_price" and req.tools is not None
    assert req.tools[0].description is None
    assert req.messages is not None and req.messages[1].tool_calls is not None
    assert req.messages[2].tool_call_id == "call_1"
    assert req.messages[0].content == [{"text": "What's the price of a scarf?", "type": "text"}]
    assert _parse(HF_STREAM).sampling.max_tokens == 8
    assert _parse(LEGACY_COMPLETION).stream is False


# ---- in process: the real app, a worker mocked at the upstream seam ----


def _worker_sse(tool: bool) -> bytes:
    head = b'data: {"id":"w","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    deltas = [b'{"role":"assistant","content":""}']
    if tool:
        deltas += [b'{"tool_calls":[{"id":"call_9","type":"function","index":0,"function":'
                   b'{"name":"get_current_price","arguments":""}}]}',
                   b'{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}']
    else:
        deltas += [b'{"content":"Big."}']
    out = b"".join(head + b'[{"index":0,"delta":' + d + b',"finish_reason":null}]}\n\n'
                   for d in deltas)
    out += head + b'[{"index":0,"delta":{},"finish_reason":"' + \
        (b"tool_calls" if tool else b"stop") + b'"}]}\n\n'
    out += head + b'[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}\n\n'
    return out + b"data: [DONE]\n\n"


WHOLE_OK = harness.WHOLE_OK


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(STREAMING))
async def test_es_streaming_bodies_get_answers_es_parses(name: str) -> None:
    body = STREAMING[name]
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{harness.UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=_worker_sse("tools" in body),
            headers={"content-type": "text/event-stream"}))
        resp = await harness.call(r, body)
    assert resp.status_code == 200, resp.text
    for gen in GENERATIONS:
        chunks = check_stream(resp.content, gen)
        if "stream_options" in body:  # the usage chunk ES reads its token counts from
            assert chunks[-1]["usage"]["total_tokens"] == 5 and chunks[-1]["choices"] == []
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    calls = [t for c in chunks if c["choices"]
             for t in c["choices"][0]["delta"].get("tool_calls") or ()]
    assert (calls[0]["function"]["name"] == "get_current_price") if "tools" in body \
        else text == "Big."


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(WHOLE))
async def test_es_non_streaming_bodies_get_answers_es_parses(name: str) -> None:
    with respx.mock(assert_all_called=False) as r:
        route = r.post(f"{harness.UP1}/v1/chat/completions").mock(side_effect=harness.worker_ok)
        resp = await harness.call(r, WHOLE[name])
    assert resp.status_code == 200
    assert check_whole(resp.content) == "Hello"
    sent = orjson.loads(route.calls.last.request.content)
    assert sent["model"] == "org/model" and "n" not in sent  # n 1 is the default


@pytest.mark.anyio
async def test_model_less_bodies_get_tgi_shaped_answers_the_current_parser_takes() -> None:
    """ES's hugging_face (no model_id) and SageMaker openai-schema bodies carry no `model`, so
    /v1/chat/completions answers in TGI's shape (tgi_chat.py); the current parser takes it."""
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{harness.UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=_worker_sse(False), headers={"content-type": "text/event-stream"}))
        streamed = await harness.call(r, SAGEMAKER_STREAM)
        r.post(f"{harness.UP1}/v1/chat/completions").mock(side_effect=harness.worker_ok)
        whole = await harness.call(r, HF_NO_MODEL)
    chunks = check_stream(streamed.content, "parser")
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[-1]["usage"] is not None
    assert check_whole(whole.content) == "Hello"


@pytest.mark.anyio
async def test_model_less_tgi_shaped_stream_and_the_older_processor() -> None:
    """ES 8.19/9.x OpenAiUnifiedStreamingProcessor refuses `tool_calls: null` (declareObjectArray);
    a hugging_face endpoint without model_id sends no model and gets TGI's chat shape."""
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{harness.UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=_worker_sse(False), headers={"content-type": "text/event-stream"}))
        streamed = await harness.call(r, SAGEMAKER_STREAM)
    check_stream(streamed.content, "processor")
