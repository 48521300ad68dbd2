"""Elasticsearch as a client of the OpenAI front end, where its versions differ from the rules
in test_elastic_target.py: 8.18 / 9.0 refuse `"usage": null` in a stream chunk, and 9.6 sends
non-streaming unified chat completions and parses them with its shared chunk parser.

Sources: Elasticsearch x-pack inference `OpenAiUnifiedStreamingProcessor` (8.18 / 9.0: `usage`
declared with declareObject, which takes no JSON null), `OpenAiUnifiedChatCompletionParser`
NON_STREAMING_PARSER and `OpenAiUnifiedChatCompletionResponseEntity` (9.6, PR #158022: `id` and
`choices` required, each choice a `message` object and an int `index`, `role` and `reasoning`
strings when present, `content` a string or null, tool calls' `id`, `type` and `arguments`
strings), and `HttpClient` (an Apache HttpAsyncClient with its default user agent).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import respx

from adapters.frontends import openai_encode
from tests.unit import test_elastic_target as target
from tests.unit import test_pipeline_respx as harness

ES_HEADERS = {"user-agent": "Apache-HttpAsyncClient/4.1.5 (Java/21.0.5)",
              "authorization": "Bearer k", "content-type": "application/json"}


def check_first_processor(chunk: dict[str, Any]) -> None:
    """8.18 / 9.0: the processor's rules, and `usage` an object when present (never null)."""
    target.check_chunk(chunk, "processor")
    target._field(chunk, "chat_completion_chunk", "usage", target.OBJECT)


def check_unified_whole(obj: Any) -> str:
    """9.6 NON_STREAMING_PARSER on a whole chat completion; the first choice's content."""
    root = "chat_completion_chunk"
    target._field(obj, root, "id", target.STRING, required=True)
    target._field(obj, root, "model", target.STRING)
    target._field(obj, root, "object", target.STRING)
    choices = target._field(obj, root, "choices", target.ARRAY, required=True)
    for choice in target._items(choices):
        target._field(choice, "choice", "index", target.INT, required=True)
        target._field(choice, "choice", "finish_reason", target.STRING_OR_NULL)
        msg = target._field(choice, "choice", "message", target.OBJECT, required=True)
        target._field(msg, "message", "content", target.STRING_OR_NULL)
        target._field(msg, "message", "refusal", target.STRING_OR_NULL)
        target._field(msg, "message", "role", target.STRING)
        target._field(msg, "message", "reasoning", target.STRING)
        for call in target._items(target._field(msg, "message", "tool_calls",
                                                target.ARRAY_OR_NULL)):
            target._field(call, "tool_call", "id", target.STRING)
            target._field(call, "tool_call", "type", target.STRING)
    usage = target._field(obj, root, "usage", target.OBJECT_OR_NULL)
    if usage is not None:
        target._check_usage(usage, "parser")
    content = target._items(choices)[0]["message"].get("content")
    return str(content)


def test_the_first_processor_refuses_a_null_usage() -> None:
    with pytest.raises(target.Refused):
        check_first_processor({**target.GOOD, "usage": None})
    check_first_processor(target.GOOD)


def test_only_elasticsearch_s_client_is_recognised() -> None:
    assert openai_encode.from_elasticsearch(ES_HEADERS)
    assert not openai_encode.from_elasticsearch({"user-agent": "OpenAI/Python 1.99.0"})
    assert not openai_encode.from_elasticsearch({})


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["openai", "how_big", "all_fields"])
async def test_elasticsearch_streams_carry_no_null_usage(name: str) -> None:
    """ES always asks for usage (stream_options.include_usage), so an OpenAI answer would put
    `"usage": null` on every chunk but the last; to Elasticsearch the key is left out."""
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{harness.UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=target._worker_sse("tools" in target.STREAMING[name]),
            headers={"content-type": "text/event-stream"}))
        es = await harness.call(r, target.STREAMING[name], headers=ES_HEADERS)
        sdk = await harness.call(r, target.STREAMING[name])
    assert b'"usage":null' not in es.content
    chunks = target.check_stream(es.content, "processor")
    for chunk in chunks:
        check_first_processor(chunk)
    assert chunks[-1]["usage"]["total_tokens"] == 5
    assert b'"usage":null' in sdk.content  # other OpenAI clients get OpenAI's bytes


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(target.WHOLE))
async def test_elasticsearch_non_streaming_chat_gets_an_answer_its_parser_takes(
        name: str) -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{harness.UP1}/v1/chat/completions").mock(side_effect=harness.worker_ok)
        resp = await harness.call(r, target.WHOLE[name], headers=ES_HEADERS)
    assert resp.status_code == 200
    assert check_unified_whole(resp.json()) == "Hello"
    assert target.check_whole(resp.content) == "Hello"  # and the older completion parser
