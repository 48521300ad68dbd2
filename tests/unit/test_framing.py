"""The incremental SSE reader follows the WHATWG rules for any chunking of its input."""

from __future__ import annotations

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


def test_named_events_and_unterminated_tail() -> None:
    dec = framing.SseDecoder()
    assert dec.feed(b"event: error\ndata: {}\n\ndata: tail") == [(b"error", b"{}")]
    assert dec.pending
    assert dec.close() == [(b"message", b"tail")]
