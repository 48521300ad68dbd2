"""A worker event that is JSON but not the worker's shape (a choice, delta, usage or token that
is not an object, a count that is not a number, a text that is not a string) is the worker's
malformed answer: UpstreamBroken (STYLE.md section 5: "UpstreamBroken 502 (failed, malformed
or unfinished)"), in the client's own error body, never the gateway's "internal error" logged
as a bug."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import respx

from adapters import base
from adapters.backends import checked, openai_decode, tgi_decode
from schemas import errors
from schemas import events as ev
from tests.unit.test_pipeline_respx import CHAT, UP1, call, make_config

Make = Callable[[], base.StreamDecoder]

DECODERS: dict[str, tuple[Make, list[bytes]]] = {
    "openai-chat-stream": (lambda: openai_decode.OpenAIDecoder(True, True), [
        b'{"choices":[1]}', b'{"choices":[{"index":0,"delta":"x"}]}',
        b'{"choices":{"a":1}}', b'{"usage":5}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[5]}}]}',
        b'{"choices":[{"index":0,"delta":{"tool_calls":[{"function":"f"}]}}]}',
        # a text or an index of another JSON type: the compiled build's encoders would refuse
        # it mid-stream, so both builds refuse it here (checked.text)
        b'{"choices":[{"index":0,"delta":{"content":5}}]}',
        b'{"choices":[{"index":"0","delta":{"content":"a"}}]}',
        b'{"choices":[{"index":0,"delta":{"reasoning":{"a":1}}}]}',
        # a finish_reason that is no string, and a `false` index: the pure build took them
        # (an unknown reason as a natural end, false as index false), the compiled one refused
        # them (tests/matrix/test_odd_answers.py compares the builds)
        b'{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":5}]}',
        b'{"choices":[{"index":0,"delta":{},"finish_reason":{"a":1}}]}',
        b'{"choices":[{"index":false,"delta":{"content":"a"}}]}']),
    "openai-text-stream": (lambda: openai_decode.OpenAIDecoder(False, True), [
        b'{"choices":["x"]}', b'{"usage":{"prompt_tokens":"many"}}',
        b'{"choices":[{"index":0,"text":"a","logprobs":{"tokens":5}}]}',
        b'{"choices":[{"index":0,"text":["a"]}]}', b'{"choices":[{"index":1.0,"text":"a"}]}',
        b'{"choices":[{"index":0,"text":"a","finish_reason":-1}]}']),
    "tgi-stream": (lambda: tgi_decode.TgiStreamDecoder([], False, False), [
        b'{"token":{"id":1,"text":"a"},"generated_text":"a","details":{"input_length":3}}',
        b'{"token":{"id":1,"text":"a"},"generated_text":"a","details":"x"}',
        b'{"token":{"id":1,"text":"a"},"generated_text":"a","details":{"finish_reason":{}}}']),
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
                                  b'"finish_reason":1.5}]}',
                                  b'{"choices":[{"index":0,"message":{"content":"a"},'
                                  b'"finish_reason":"stop"}],"usage":[1]}'])
def test_a_whole_body_of_the_wrong_shape_is_the_workers_malformed_answer(body: bytes) -> None:
    dec = openai_decode.OpenAIDecoder(True, False)
    dec.feed(body)
    with pytest.raises(errors.UpstreamBroken, match="wrong shape"):
        dec.close()


@pytest.mark.parametrize("bom", [b"\xef\xbb\xbf", b""])
def test_a_whole_answer_after_a_byte_order_mark_reads_as_without(bom: bytes) -> None:
    """RFC 8259 section 8.1: a JSON parser may ignore a leading BOM; Python's json and httpx's
    `Response.json()`, which the OpenAI SDK reads a worker with directly, do. Twice is too
    many, as for them."""
    body = b'{"choices":[{"index":0,"message":{"content":"a"},"finish_reason":"stop"}]}'
    dec = openai_decode.OpenAIDecoder(True, False)
    dec.feed(bom + body)
    assert dec.close() == [ev.TextDelta(0, "a"), ev.Finish(0, "eos")]
    twice = openai_decode.OpenAIDecoder(True, False)
    twice.feed(b"\xef\xbb\xbf\xef\xbb\xbf" + body)
    with pytest.raises(errors.UpstreamBroken, match="malformed JSON"):
        twice.close()


def test_a_tgi_whole_answer_whose_finish_reason_is_no_string_is_malformed() -> None:
    dec = tgi_decode.TgiWholeDecoder([], False, False, None, 1)
    dec.feed(b'{"generated_text":"a","details":{"finish_reason":2,"generated_tokens":1}}')
    with pytest.raises(errors.UpstreamBroken, match="wrong shape"):
        dec.close()


@pytest.mark.parametrize("odd", [b"false", b"true", b'"7"', b"1180591620717411303424"])
def test_a_tgi_token_id_that_is_no_integer_is_no_id(odd: bytes) -> None:
    """A token's id is the worker's to leave out (the client then gets -1): a bool (which
    the compiled build's `int` would take as 0 or 1) or one past what JSON writers keep is
    none too."""
    dec = tgi_decode.TgiStreamDecoder([], False, False)
    got = dec.feed(b'data: {"token":{"id":' + odd + b',"text":"a"},"generated_text":null}\n\n')
    assert got == [ev.TextDelta(0, "a", None)]


@pytest.mark.parametrize("odd", [b"true", b"1180591620717411303424", b"[1]"])
def test_a_stop_reason_that_names_no_stop_is_a_natural_end(odd: bytes) -> None:
    dec = openai_decode.OpenAIDecoder(True, True)
    got = decode(dec, b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop",'
                 b'"stop_reason":' + odd + b"}]}\n\ndata: [DONE]\n\n")
    assert got == [ev.Finish(0, "eos")]


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_no_integer_nor_number(value: bool) -> None:
    with pytest.raises(TypeError):
        checked.integer(value, "a count")
    with pytest.raises(TypeError):
        checked.number(value, "a log prob")
    assert checked.matched(value) is None and checked.token_id(value) is None


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


# ---- a choice ends at its finish (OpenAI-compatible workers) ----

def chunk(i: int, content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": i, "delta": delta, "finish_reason": finish}]}) + b"\n\n"


def decode(dec: base.StreamDecoder, *parts: bytes) -> list[Any]:
    return [e for p in parts for e in dec.feed(p)] + dec.close()


def test_what_a_worker_sends_for_a_choice_after_its_finish_is_not_part_of_it() -> None:
    """OpenAI's chunk object: `finish_reason` is set on a choice's last chunk. Text or a second
    finish for that choice after it is dropped, whichever client protocol reads the events
    (LMI's encoders already ended the choice there; OpenAI's, TGI's and Elastic's wrote it
    after the end, and the folded answer took it in). A second finish is what trtllm-serve can
    write with n > 1 (NVIDIA/TensorRT-LLM tensorrt_llm/serve/postprocess_handlers.py,
    chat_stream_post_processor: `finish_reason_sent` is made anew for each step's outputs, and
    an output that finished keeps its finish_reason)."""
    dec = openai_decode.OpenAIDecoder(True, True, choices=2)
    got = decode(dec, chunk(0, "Hi"), chunk(1, "Yo"), chunk(0, None, "stop"), chunk(0, "MORE"),
                 chunk(1, "!"), chunk(0, None, "length"), chunk(1, None, "stop"),
                 b"data: [DONE]\n\n")
    assert got == [ev.TextDelta(0, "Hi"), ev.TextDelta(1, "Yo"), ev.Finish(0, "eos"),
                   ev.TextDelta(1, "!"), ev.Finish(1, "eos")]


def test_a_stream_that_leaves_a_choice_unfinished_is_broken() -> None:
    """n choices: each must end with its finish_reason before `[DONE]`, else the client's choice
    would end with no finish reason and no error."""
    dec = openai_decode.OpenAIDecoder(True, True, choices=2)
    dec.feed(chunk(0, "Hi") + chunk(1, "Yo") + chunk(1, None, "stop"))
    with pytest.raises(errors.UpstreamBroken, match="finish reason"):
        dec.feed(b"data: [DONE]\n\n")
        dec.close()


@pytest.mark.anyio
async def test_text_after_a_finish_reaches_no_client() -> None:
    """End to end, OpenAI's client: the stream the worker sent after the finish is not relayed."""
    body = (chunk(0, "Hello") + chunk(0, None, "stop") + chunk(0, " again")
            + b"data: [DONE]\n\n")
    with respx.mock(assert_all_called=False) as r:
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=body, headers={"content-type": "text/event-stream"}))
        resp = await call(r, {**CHAT, "stream": True})
    assert resp.status_code == 200
    chunks = [orjson.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
