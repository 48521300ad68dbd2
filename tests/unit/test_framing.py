"""The incremental SSE reader follows the WHATWG rules for any chunking of its input; a text's
JSON body is byte for byte orjson's."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters import framing

# trtllm-serve writes `} \n\n` (wire-formats.md section 6.1); TGI < 2.1 writes `data:` with no
# space and `:` keep-alives (section 4.4); Elasticsearch puts a BOM before `event:` (section 7.3).
BODY = (b'data: {"a":1} \n\n: keep-alive\n\ndata:{"b":2}\r\n\r\n'
        b'\xef\xbb\xbfevent: message\ndata: x\ndata: y\n\nid: 3\nretry: 10\n\ndata: [DONE]\n\n')
EVENTS = [(b"message", b'{"a":1} '), (b"message", b'{"b":2}'), (b"message", b"x\ny"),
          (b"message", b"[DONE]")]


def test_whole_body() -> None:
    dec = framing.SseDecoder()
    assert dec.feed(BODY) + dec.close() == EVENTS
    assert not dec.pending


@given(st.lists(st.integers(0, len(BODY)), max_size=10))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    dec = framing.SseDecoder()
    points = sorted({0, len(BODY), *cuts})
    got = [e for a, b in zip(points, points[1:]) for e in dec.feed(BODY[a:b])] + dec.close()
    assert got == EVENTS


@given(st.lists(st.integers(0, 40), max_size=4))
def test_a_stream_that_opens_with_a_bom_keeps_its_first_event(cuts: list[int]) -> None:
    """WHATWG HTML 9.2.6: the stream's decoder strips one leading BOM, so its first line is
    a `data:` field like any other. It once read as a field named BOM + `data` and was
    dropped: a TGI stream lost its first token, a chat stream its tool call's name."""
    body = b'\xef\xbb\xbfdata: {"token":1}\n\ndata: {"token":2}\n\n'
    dec = framing.SseDecoder()
    points = sorted({0, len(body), *(c for c in cuts if c <= len(body))})
    got = [e for a, b in zip(points, points[1:]) for e in dec.feed(body[a:b])] + dec.close()
    assert got == [(b"message", b'{"token":1}'), (b"message", b'{"token":2}')]


def test_named_events_and_unterminated_tail() -> None:
    dec = framing.SseDecoder()
    assert dec.feed(b"event: error\ndata: {}\n\ndata: tail") == [(b"error", b"{}")]
    assert dec.pending
    assert dec.close() == [(b"message", b"tail")]


# Multi-line data, CRLF and bare CR line ends, a comment and a named event (WHATWG: CR, LF and
# CRLF each end a line; a CRLF split by a read boundary is still one line end).
CRLF_BODY = (b"data: a\r\ndata: b\r\n\r\n: ping\r\n\r\nevent: error\r\ndata: {}\r\n\r\n"
             b"data: c\rdata: d\r\r")
CRLF_EVENTS = [(b"message", b"a\nb"), (b"error", b"{}"), (b"message", b"c\nd")]


def test_every_cut_of_crlf_and_multi_line_data() -> None:
    for cut in range(len(CRLF_BODY) + 1):
        dec = framing.SseDecoder()
        got = dec.feed(CRLF_BODY[:cut]) + dec.feed(CRLF_BODY[cut:]) + dec.close()
        assert got == CRLF_EVENTS, f"cut at {cut}"


def test_crlf_one_byte_at_a_time() -> None:
    dec = framing.SseDecoder()
    got = [e for i in range(len(CRLF_BODY)) for e in dec.feed(CRLF_BODY[i:i + 1])]
    assert got + dec.close() == CRLF_EVENTS


def test_an_event_name_from_an_earlier_read_survives_a_whole_event_read() -> None:
    """The fast path for reads that end on an event boundary must not forget `event:`."""
    dec = framing.SseDecoder()
    assert dec.feed(b"event: error\n") == []
    assert dec.feed(b"data: {}\n\n") == [(b"error", b"{}")]


LINES = b'{"a":1}\r\n\n{"b":\r2}\r{"c":3}\n  \n{"d":4}'


def test_json_lines_any_cut() -> None:
    """LMI's jsonlines framing: blank lines skipped, CR / LF / CRLF ends, an unended last line."""
    for a in range(len(LINES) + 1):
        for b in range(a, len(LINES) + 1):
            dec = framing.LineDecoder()
            got = dec.feed(LINES[:a]) + dec.feed(LINES[a:b]) + dec.feed(LINES[b:])
            assert dec.pending
            assert got + dec.close() == [b'{"a":1}', b'{"b":', b"2}", b'{"c":3}', b'{"d":4}']


@given(st.binary(max_size=40).filter(lambda b: b"\r" not in b),
       st.sampled_from([b"data: ", b"data:", b"event: x\ndata: ", b": c\ndata: ", b""]))
def test_a_read_of_one_event_reads_as_the_general_parser_reads_it(payload: bytes,
                                                                  field: bytes) -> None:
    """The shortcut for a read of one `data: ` line (how vLLM, TGI and trtllm-serve write each
    token) answers what the line-by-line WHATWG reading answers, whatever the payload holds."""
    chunk = field + payload + b"\n\n"
    fast, general = framing.SseDecoder(), framing.SseDecoder()
    assert fast.feed(chunk) == general._general(chunk)
    assert fast.close() == general.close()


@given(st.text())
def test_a_texts_json_body_is_what_orjson_writes_inside_the_quotes(text: str) -> None:
    """`json_body` copies a text with nothing to escape as its UTF-8 and asks orjson for the
    rest: either way the bytes are orjson's, whatever the text (quotes, backslashes, control
    characters, DEL, U+2028, any plane)."""
    assert framing.json_body(text) == orjson.dumps(text)[1:-1]


@pytest.mark.parametrize("text", ["a\ud800", "\udfff"])
def test_a_lone_surrogate_is_refused_as_orjson_refuses_it(text: str) -> None:
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(text)
    with pytest.raises(orjson.JSONEncodeError):
        framing.json_body(text)


@given(st.binary(max_size=12), st.integers(0, 3), st.integers(0, 3))
def test_plain_bytes_are_exactly_those_with_nothing_json_escapes(data: bytes, a: int,
                                                                 b: int) -> None:
    start = min(a, len(data))
    stop = max(start, len(data) - b)
    assert framing.json_plain(data, start, stop) == \
        all(c >= 32 and c not in b'"\\' for c in data[start:stop])
