"""Every worker decoder gives the same events whatever the chunking, and an error after exactly
the events before it, raised once.

The streams hold what workers and proxies really write (wire-formats.md section 1): CRLF line
ends (a proxy may rewrite LF, and WHATWG SSE allows CR, LF and CRLF), a `data:` value split
over two lines (joined with LF, which JSON takes as whitespace), `:` keep-alive comments (TGI's
axum, vLLM's --sse-keep-alive-interval), and the in-band errors of each worker: vLLM's
`{"error": {...}}` then `data: [DONE]` (3.5), TGI's `{"error","error_type"}` (4.5), TGI chat's
`{"error":{"message","http_status_code"}}`, Triton's `{"error": "..."}` (6.2), and text of 2-,
3- and 4-byte UTF-8 characters. Each stream is cut at every position (inside a character too),
fed one byte at a time, and cut at hypothesis's choice of positions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import base
from adapters.backends import decoder, openai_decode, tgi_decode, triton_decode
from schemas import errors
from schemas import events as ev

Outcome = tuple[list[ev.Event], tuple[str, str] | None]


def sse(*events: bytes) -> bytes:
    """Each event as `data:` lines (a `\\n` in an event starts a new `data:` line), CRLF
    ended, a keep-alive comment between events."""
    out = b""
    for e in events:
        out += b"".join(b"data: " + line + b"\r\n" for line in e.split(b"\n")) + b"\r\n"
        out += b": keep-alive\r\n\r\n"
    return out


def chat_chunk(delta: bytes, finish: bytes = b"null") -> bytes:
    return (b'{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,\n"delta":'
            + delta + b',"logprobs":null,"finish_reason":' + finish + b"}]}")


OPENAI_EVENTS = [chat_chunk(b'{"role":"assistant","content":""}'),
                 chat_chunk(b'{"content":"Hel"}'), chat_chunk(b'{"content":"lo"}')]
OPENAI_ERROR = (b'{"error": {"message": "engine died", "type": "InternalServerError",\n'
                b'"param": null, "code": 500}}')
OPENAI_OK = [ev.Role(0, "assistant"), ev.TextDelta(0, "Hel"), ev.TextDelta(0, "lo")]

TGI_EVENTS = [b'{"index":1,"token":{"id":10,"text":"Hel","logprob":-0.1,"special":false},\n'
              b'"generated_text":null,"details":null}',
              b'{"index":2,"token":{"id":11,"text":"lo","logprob":-0.2,"special":false},'
              b'"generated_text":null,"details":null}']
TGI_LAST = (b'{"index":3,"token":{"id":2,"text":"</s>","logprob":-0.3,"special":true},\n'
            b'"generated_text":"Hello","details":{"finish_reason":"eos_token",'
            b'"generated_tokens":3,"seed":null,"input_length":4}}')
TGI_ERROR = (b'{"error":"Request failed during generation: CUDA out of memory",\n'
             b'"error_type":"generation"}')
TGI_OK = [ev.TextDelta(0, "Hel", [10]), ev.TextDelta(0, "lo", [11])]

TGI_CHAT_ERROR = (b'{"error":{"message":"Request failed during generation: boom",\n'
                  b'"http_status_code":422}}')

TRITON_EVENTS = [b'{"model_name":"ensemble","num_input_tokens":4,\n"num_output_tokens":1,'
                 b'"text_output":"Hel"}',
                 b'{"model_name":"ensemble","num_input_tokens":4,"num_output_tokens":1,'
                 b'"text_output":"lo"}']
TRITON_ERROR = b'{"error":\n"in ensemble \'ensemble\', Executor failed: out of memory"}'
TRITON_OK = [ev.TextDelta(0, "Hel"), ev.TextDelta(0, "lo")]


def openai() -> base.StreamDecoder:
    return openai_decode.OpenAIDecoder(True, True)


def tgi() -> base.StreamDecoder:
    return tgi_decode.TgiStreamDecoder([], False, False)


def tgi_chat() -> base.StreamDecoder:
    return tgi_decode.TgiChatDecoder(True, [], False)


def triton() -> base.StreamDecoder:
    return triton_decode.TritonDecoder(True, 100, [], False)


# name -> (decoder, worker bytes, the events, the error as (class, message) or None)
CASES: dict[str, tuple[Callable[[], base.StreamDecoder], bytes, Outcome]] = {
    "openai": (openai, sse(*OPENAI_EVENTS, chat_chunk(b"{}", b'"length"'), b"[DONE]"),
               ([*OPENAI_OK, ev.Finish(0, "length")], None)),
    "openai_error": (openai, sse(*OPENAI_EVENTS, OPENAI_ERROR, b"[DONE]"),
                     (OPENAI_OK, ("UpstreamBroken", "the worker failed: engine died"))),
    "tgi": (tgi, sse(*TGI_EVENTS, TGI_LAST),
            ([*TGI_OK, ev.TextDelta(0, "", [2]), ev.Finish(0, "eos"), ev.Usage(4, 3)], None)),
    "tgi_error": (tgi, sse(*TGI_EVENTS, TGI_ERROR, TGI_LAST),
                  (TGI_OK, ("UpstreamBroken", "the worker failed: Request failed during "
                            "generation: CUDA out of memory"))),
    "tgi_chat": (tgi_chat, sse(*OPENAI_EVENTS, chat_chunk(b"{}", b'"eos_token"'), b"[DONE]"),
                 ([*OPENAI_OK, ev.Finish(0, "eos")], None)),
    "tgi_chat_error": (tgi_chat, sse(*OPENAI_EVENTS, TGI_CHAT_ERROR, b"[DONE]"),
                       (OPENAI_OK, ("UpstreamBroken", "the worker failed: Request failed "
                                    "during generation: boom"))),
    "triton": (triton, sse(*TRITON_EVENTS),
               ([*TRITON_OK, ev.Finish(0, "eos"), ev.Usage(4, 2)], None)),
    # Multi-byte characters (2, 3 and 4 bytes in UTF-8): every cut above falls inside one too.
    "openai_utf8": (openai, sse(chat_chunk('{"content":"h\u00e9\u4e2d"}'.encode()),
                                chat_chunk('{"content":"\U0001f600 \u00fc"}'.encode(),
                                           b'"stop"'), b"[DONE]"),
                    ([ev.TextDelta(0, "h\u00e9\u4e2d"), ev.TextDelta(0, "\U0001f600 \u00fc"),
                      ev.Finish(0, "eos")], None)),
    "tgi_utf8": (tgi, sse('{"index":1,"token":{"id":5,"text":"\u00e9\U0001f600",'
                          '"logprob":-0.1,"special":false},"generated_text":"\u00e9\U0001f600",'
                          '"details":{"finish_reason":"length","generated_tokens":1,'
                          '"seed":null,"input_length":2}}'.encode()),
                 ([ev.TextDelta(0, "\u00e9\U0001f600", [5]), ev.Finish(0, "length"),
                   ev.Usage(2, 1)], None)),
    "triton_utf8": (triton, sse('{"num_input_tokens":2,"num_output_tokens":1,'
                                '"text_output":"\u4e2d\u00e9"}'.encode()),
                    ([ev.TextDelta(0, "\u4e2d\u00e9"), ev.Finish(0, "eos"), ev.Usage(2, 1)],
                     None)),
    "triton_error": (triton, sse(*TRITON_EVENTS, TRITON_ERROR, *TRITON_EVENTS),
                     (TRITON_OK, ("UpstreamBroken", "the worker failed: in ensemble "
                                  "'ensemble', Executor failed: out of memory"))),
}


def run(make: Callable[[], base.StreamDecoder], parts: list[bytes]) -> Outcome:
    """The events a client would get, then the error, which must come once: a decoder that
    raised answers nothing more."""
    dec = make()
    got: list[ev.Event] = []
    try:
        for part in parts:
            got += dec.feed(part)
        got += dec.close()
    except errors.GatewayError as exc:
        assert dec.feed(b"data: {}\n\n") == [] and dec.close() == []
        return got, (type(exc).__name__, exc.message)
    return got, None


def split_at(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(body), *cuts})
    return [body[a:b] for a, b in zip(points, points[1:])]


@pytest.mark.parametrize("name", CASES)
def test_whole_body_in_one_read(name: str) -> None:
    make, body, outcome = CASES[name]
    assert b"\r\n" in body and b": keep-alive" in body
    assert run(make, [body]) == outcome


@pytest.mark.parametrize("name", CASES)
def test_every_single_cut(name: str) -> None:
    make, body, outcome = CASES[name]
    for cut in range(len(body) + 1):
        assert run(make, [body[:cut], body[cut:]]) == outcome, f"cut at {cut}: {body[:cut]!r}"


@pytest.mark.parametrize("name", CASES)
def test_one_byte_at_a_time(name: str) -> None:
    make, body, outcome = CASES[name]
    assert run(make, [body[i:i + 1] for i in range(len(body))]) == outcome


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_chunking(name: str, data: st.DataObject) -> None:
    make, body, outcome = CASES[name]
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=12))
    assert run(make, split_at(body, cuts)) == outcome


def test_events_of_the_read_that_held_the_error_are_returned_first() -> None:
    """The bug this base fixed: the OpenAI decoder raised at once and lost the text of the read
    (vLLM writes text and its error event back to back, wire-formats.md 3.5)."""
    dec = openai()
    body = sse(*OPENAI_EVENTS, OPENAI_ERROR, b"[DONE]")
    assert dec.feed(body) == OPENAI_OK
    with pytest.raises(errors.UpstreamBroken, match="engine died"):
        dec.feed(b"")
    assert dec.close() == []


def test_an_error_alone_in_its_read_is_raised_at_once() -> None:
    dec = triton()
    assert dec.feed(sse(*TRITON_EVENTS)) == TRITON_OK
    with pytest.raises(errors.UpstreamBroken, match="out of memory"):
        dec.feed(sse(TRITON_ERROR))
    assert dec.feed(sse(*TRITON_EVENTS)) == [] and dec.close() == []


def test_a_deferred_error_is_raised_at_close() -> None:
    dec = tgi()
    assert dec.feed(sse(*TGI_EVENTS, b"{not json}")) == TGI_OK
    with pytest.raises(errors.UpstreamBroken, match="malformed JSON"):
        dec.close()


class _Lines(decoder.FramedDecoder):
    """A JSON-lines worker (LMI's jsonlines framing): `{"t": text}` per line, `{"error"}`."""

    def __init__(self) -> None:
        super().__init__("lines")

    def on_event(self, obj: dict[str, Any], out: list[ev.Event]) -> None:
        if "error" in obj:
            raise errors.UpstreamBroken(str(obj["error"]))
        out.append(ev.TextDelta(0, obj["t"]))


def test_json_lines_framing_at_every_cut() -> None:
    body = b'{"t":"a"}\r\n{"t":"b"}\r\r\n\n{"error":"x"}\n{"t":"c"}\n'
    want: Outcome = ([ev.TextDelta(0, "a"), ev.TextDelta(0, "b")], ("UpstreamBroken", "x"))
    for cut in range(len(body) + 1):
        assert run(_Lines, [body[:cut], body[cut:]]) == want, f"cut at {cut}"
    assert run(_Lines, [b'{"t":"a"}\n{"t":"b"}']) == ([ev.TextDelta(0, "a")], (
        "UpstreamBroken", "the worker's stream ended inside an event"))


def test_a_whole_body_split_inside_multibyte_characters() -> None:
    """A non-streaming body is read whole, whatever cuts its characters' bytes."""
    body = ('{"choices":[{"index":0,"message":{"role":"assistant","content":"h\u00e9\u4e2d'
            '\U0001f600"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,'
            '"completion_tokens":2,"total_tokens":3}}').encode()
    want = ([ev.Role(0, "assistant"), ev.TextDelta(0, "h\u00e9\u4e2d\U0001f600"),
             ev.Finish(0, "eos"), ev.Usage(1, 2)], None)
    for cut in range(len(body) + 1):
        assert run(lambda: openai_decode.OpenAIDecoder(True, False),
                   [body[:cut], body[cut:]]) == want, f"cut at {cut}"
