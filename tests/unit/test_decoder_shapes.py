"""A worker event that is JSON but not the worker's shape (a choice, delta, usage or token that
is not an object, a count that is not a number) is the worker's malformed answer: UpstreamBroken
(STYLE.md section 5: "UpstreamBroken 502 (failed, malformed or unfinished)"), in the client's
own error body, never the gateway's "internal error" logged as a bug."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson
import pytest
import respx

from adapters import base
from adapters.backends import openai_decode, tgi_decode
from schemas import errors
from tests.unit.test_pipeline_respx import CHAT, UP1, call, make_config

Make = Callable[[], base.StreamDecoder]

DECODERS: dict[str, tuple[Make, list[bytes]]] = {
    "openai-chat-stream": (lambda: openai_decode.OpenAIDecoder(True, True), [
        b'{"choices":[1]}', b'{"choices":[{"index":0,"delta":"x"}]}',
        b'{"choices":{"a":1}}', b'{"usage":5}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[5]}}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"function":"f"}]}}]}']),
    "openai-text-stream": (lambda: openai_decode.OpenAIDecoder(False, True), [
        b'{"choices":["x"]}', b'{"usage":{"prompt_tokens":"many"}}',
        b'{"choices":[{"index":0,"text":"a","logprobs":{"tokens":5}}]}']),
    "tgi-stream": (lambda: tgi_decode.TgiStreamDecoder([], False, False), [
        b'{"token":{"id":1,"text":"a"},"generated_text":"a","details":{"input_length":3}}',
        b'{"token":{"id":1,"text":"a"},"generated_text":"a","details":"x"}']),
}
CASES = [(name, bad) for name, (_, bads) in DECODERS.items() for bad in bads]


@pytest.mark.parametrize(("name", "bad"), CASES)
def test_an_event_of_the_wrong_shape_is_the_workers_malformed_answer(name: str,
                                                                      bad: bytes) -> None:
    dec = DECODERS[name][0]()
    with pytest.raises(errors.UpstreamBroken, match="wrong shape"):
        dec.feed(b"data: " + bad + b"\n\n")
        dec.close()


@pytest.mark.parametrize("body", [b'{"choices":[{"index":0,"message":"hi"}]}',
                                  b'{"choices":[{"index":0,"message":{"content":"a"},'
                                  b'"finish_reason":"stop"}],"usage":[1]}'])
def test_a_whole_body_of_the_wrong_shape_is_the_workers_malformed_answer(body: bytes) -> None:
    dec = openai_decode.OpenAIDecoder(True, False)
    dec.feed(body)
    with pytest.raises(errors.UpstreamBroken, match="wrong shape"):
        dec.close()


async def first_event_answer(event: bytes) -> httpx.Response:
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=b"data: " + event + b"\n\ndata: [DONE]\n\n",
            headers={"content-type": "text/event-stream"}))
        return await call(r, {**CHAT, "stream": True},
                          make_config(failover_attempts=0, retries=0))


@pytest.mark.anyio
async def test_the_client_gets_a_failed_workers_error_not_an_internal_one() -> None:
    """Before the first byte: the OpenAI error object of a worker that failed, the same as
    for an event that is not JSON at all."""
    resp = await first_event_answer(b'{"choices":[{"index":0,"delta":"x"}]}')
    not_json = await first_event_answer(b'{"choices":[')
    assert resp.status_code == not_json.status_code >= 502
    error = orjson.loads(resp.content)["error"]
    assert error["type"] == "server_error"
    assert error["code"] == orjson.loads(not_json.content)["error"]["code"] != "internal_error"
