"""Streamed tool calls are numbered within their choice, whatever index the worker gives them.

vLLM up to 0.14 (vllm-project/vllm vllm/entrypoints/openai/serving_chat.py,
chat_completion_stream_generator, the `tool_choice_function_name` branch: 0.9.2, 0.11.0 and
0.14.0 wheels) streams a named `tool_choice` call with `DeltaToolCall(..., index=i)`, where `i`
is the choice's index (`output.index`), not the call's: with n = 2 the second choice's only
call arrives as index 1. OpenAI's clients (openai-python lib/streaming/chat/_completions.py,
`_accumulate_chunk` keys tool calls by index) and the folded answer would see a call 0 that
never came.
"""

from __future__ import annotations

import orjson

from adapters.backends import openai_decode
from schemas import canonical
from schemas import events as ev


def _chunk(choice: int, delta: dict[str, object], finish: str | None = None) -> bytes:
    c: dict[str, object] = {"index": choice, "delta": delta, "logprobs": None,
                            "finish_reason": finish}
    if finish:
        c["stop_reason"] = None
    return b"data: " + orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                                     "created": 1, "model": "m", "choices": [c]}) + b"\n\n"


def _named_call_stream() -> bytes:
    """vLLM 0.11 bytes for n=2, tool_choice {"type":"function","function":{"name":"f"}}."""
    out = b""
    for i in (0, 1):
        out += _chunk(i, {"role": "assistant", "content": ""})
    for i in (0, 1):
        out += _chunk(i, {"tool_calls": [{"id": f"chatcmpl-tool-{i}", "type": "function",
                                          "index": i,
                                          "function": {"name": "f", "arguments": "{\"a\""}}]})
    for i in (0, 1):
        out += _chunk(i, {"tool_calls": [{"index": i, "function": {"arguments": ": 1}"}}]})
    for i in (0, 1):
        out += _chunk(i, {"content": ""}, "tool_calls")
    return out + b"data: [DONE]\n\n"


def test_a_named_tool_call_of_the_second_choice_is_its_first_call() -> None:
    dec = openai_decode.OpenAIDecoder(True, True, choices=2)
    events = dec.feed(_named_call_stream()) + dec.close()
    calls = [e for e in events if isinstance(e, ev.ToolCallDelta)]
    assert [(c.choice, c.index) for c in calls] == [(0, 0), (1, 0), (0, 0), (1, 0)]
    done = canonical.Completion.fold(events, 2)
    for i in (0, 1):
        assert [(t.id, t.name, t.arguments) for t in done.choices[i].tool_calls] == [
            (f"chatcmpl-tool-{i}", "f", '{"a": 1}')]


def test_parallel_calls_of_one_choice_keep_their_order() -> None:
    """vLLM's tool parsers number a choice's calls 0, 1, ... (hermes_tool_parser.py
    `current_tool_id`); those stay as they are."""
    dec = openai_decode.OpenAIDecoder(True, True)
    body = (_chunk(0, {"tool_calls": [{"id": "a", "type": "function", "index": 0,
                                       "function": {"name": "f"}}]})
            + _chunk(0, {"tool_calls": [{"id": "b", "type": "function", "index": 1,
                                         "function": {"name": "g"}}]})
            + _chunk(0, {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})
            + _chunk(0, {}, "tool_calls") + b"data: [DONE]\n\n")
    events = dec.feed(body) + dec.close()
    calls = [(e.index, e.id, e.name, e.arguments) for e in events
             if isinstance(e, ev.ToolCallDelta)]
    assert calls == [(0, "a", "f", ""), (1, "b", "g", ""), (0, None, None, "{}")]
