"""A stream read by its text slot (adapters/backends/text_slot.py) gives exactly the events and
the error of the same stream read in full, event by event, whatever the stream and its chunking.

The streams mix what OpenAI-compatible workers write between text deltas (vLLM's role chunk,
token ids, logprobs, continuous usage, an empty delta, finishes with stop reasons, n > 1
choices interleaved, an in-band error), each written compact (vLLM's pydantic JSON) or with
Python's `json.dumps` spacing and escaping, with texts hypothesis picks (quotes, backslashes,
control characters, any Unicode).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.backends import openai_decode
from schemas import events as ev
from tests.property.test_decoder_chunking import Outcome, run, split_at

KINDS = ["text"] * 8 + ["empty", "role", "ids", "logprobs", "usage", "finish", "null_text",
                        "error"]


def encode(obj: dict[str, Any], compact: bool, ascii_only: bool) -> bytes:
    seps = (",", ":") if compact else (", ", ": ")
    return json.dumps(obj, separators=seps, ensure_ascii=ascii_only).encode()


@st.composite
def streams(draw: st.DrawFn) -> tuple[bool, int, bytes]:
    chat = draw(st.booleans())
    n = draw(st.integers(1, 2))
    compact = draw(st.booleans())
    ascii_only = draw(st.booleans())
    head: dict[str, Any] = {"id": draw(st.text(max_size=6)), "object": "chunk",
                            "created": draw(st.integers(0, 2**40)),
                            "model": draw(st.sampled_from(["demo", 'a"content":"b', "中"]))}
    payloads = []
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(KINDS))
        i = draw(st.integers(0, n - 1))
        text = draw(st.text(max_size=6))
        choice: dict[str, Any] = {"index": i}
        obj: dict[str, Any] = {**head, "choices": [choice]}
        if kind == "error":
            obj = {"error": {"message": text or "boom", "code": 500}}
        elif chat:
            delta: dict[str, Any] = {"content": text}
            if kind == "role":
                delta = {"role": "assistant", "content": ""}
            elif kind == "empty":
                delta = {}
            elif kind == "null_text":
                delta = {"content": None}
            choice["delta"] = delta
        else:
            choice["text"] = None if kind == "null_text" else ("" if kind == "empty" else text)
        if kind != "error":
            choice["logprobs"] = None
            choice["finish_reason"] = "length" if kind == "finish" else None
            if kind == "ids":
                choice["token_ids"] = [draw(st.integers(0, 9))]
            if kind == "logprobs" and chat:
                choice["logprobs"] = {"content": [{"token": text, "logprob": -0.5,
                                                   "bytes": None, "top_logprobs": []}]}
            if kind == "usage":
                obj["usage"] = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        payloads.append(encode(obj, compact, ascii_only))
    for i in range(n):  # each choice's finish, then the end
        payloads.append(encode({**head, "choices": [{"index": i, "delta": {}, "text": "",
                                                     "finish_reason": "stop"}]},
                               compact, ascii_only))
    body = b"".join(b"data: " + p + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"
    return chat, n, body


def read(chat: bool, n: int, parts: list[bytes], fast: bool) -> Outcome:
    def make() -> openai_decode.OpenAIDecoder:
        dec = openai_decode.OpenAIDecoder(chat, True, choices=n)
        dec.fast = fast
        return dec
    return run(make, parts)


@settings(max_examples=300, deadline=None)
@given(stream=streams(), data=st.data())
def test_the_slot_reads_what_the_full_read_reads(stream: tuple[bool, int, bytes],
                                                  data: st.DataObject) -> None:
    chat, n, body = stream
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=6))
    parts = split_at(body, cuts)
    assert read(chat, n, parts, True) == read(chat, n, parts, False)


def test_the_streams_above_do_use_the_slot() -> None:
    """A plain stream of the generator's shape learns a slot (else the test above compares the
    full read with itself)."""
    head = {"id": "c", "object": "chunk", "created": 1, "model": "demo"}
    body = b"".join(
        b"data: " + encode({**head, "choices": [{"index": 0, "delta": {"content": t},
                                                 "logprobs": None, "finish_reason": None}]},
                           False, True) + b"\n\n" for t in ("a", "b", "c"))
    dec = openai_decode.OpenAIDecoder(True, True)
    assert dec.feed(body) == [ev.TextDelta(0, "a"), ev.TextDelta(0, "b"), ev.TextDelta(0, "c")]
    assert dec._slot is not None
