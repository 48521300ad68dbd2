"""A stream's text chunks read by their text alone (adapters/backends/text_slot.py): a slot
is learned only where a probe proves it, and reads only chunks that differ from the learned
one in that string.

The chunk below is vLLM's, as its serving_chat.py writes a text delta
(`ChatCompletionStreamResponse.model_dump_json(exclude_unset=True)`: compact, in field order;
research/wire-formats.md section 3).
"""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.backends import openai_decode, text_slot, tgi_decode
from schemas import events as ev

HEAD = (b'{"id":"chatcmpl-7258f80b","object":"chat.completion.chunk","created":1795816800,'
        b'"model":"demo","choices":[{"index":0,"delta":{"content":')
TAIL = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]}'


def chunk(text_json: bytes, head: bytes = HEAD, tail: bytes = TAIL) -> bytes:
    return head + text_json + tail


def learned(payload: bytes) -> text_slot.TextSlot | None:
    obj = orjson.loads(payload)
    holder = obj["choices"][0]["delta"]
    return text_slot.learn(payload, obj, holder, "content", 0)


def test_a_vllm_chunk_gives_the_slot_around_its_text() -> None:
    slot = learned(chunk(b'" great"'))
    assert slot is not None
    assert (slot.head, slot.tail, slot.choice) == (HEAD, TAIL, 0)
    assert slot.text(chunk(b'" world"')) == " world"


@pytest.mark.parametrize("literal", [b'""', b'"a\\"b"', b'"\\\\"', b'"\\u00e9\\ud83d\\ude00"',
                                     '"中文 é"'.encode(), b'"line\\nbreak"', b'"}]}"'])
def test_any_json_string_in_the_slot_is_read_as_json(literal: bytes) -> None:
    slot = learned(chunk(b'"x"'))
    assert slot is not None
    assert slot.text(chunk(literal)) == orjson.loads(literal)


@pytest.mark.parametrize("payload", [
    chunk(b'"x"', tail=b'},"logprobs":null,"finish_reason":"stop","token_ids":null}]}'),
    chunk(b'"x"', head=HEAD.replace(b"chatcmpl-7258f80b", b"chatcmpl-other")),
    chunk(b"null"),  # not a string: the full read says what it means
    chunk(b"7"),
    chunk(b'"a"},"x":{"content":"b"'),  # two values where one belongs
    chunk(b'"unterminated'),
    HEAD + TAIL,
    b"",
])
def test_anything_else_is_not_read_by_the_slot(payload: bytes) -> None:
    slot = learned(chunk(b'"x"'))
    assert slot is not None
    assert slot.text(payload) is None


def test_spaces_around_the_colon_stay_in_the_slot() -> None:
    """A worker writing with Python's json.dumps defaults (`", "` and `": "`)."""
    obj = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"},
                                   "finish_reason": None}]}
    payload = json.dumps(obj).encode()
    slot = text_slot.learn(payload, obj, obj["choices"][0]["delta"], "content", 0)
    assert slot is not None and slot.head.endswith(b'"content": ')
    assert slot.text(payload.replace(b'"hi"', b'"yo"')) == "yo"


def test_the_key_inside_another_string_is_passed_over() -> None:
    """A model named with the key's bytes (escaped, as JSON must) is not the slot."""
    head = HEAD.replace(b'"model":"demo"', b'"model":"a\\"content\\":\\"b"')
    slot = learned(chunk(b'"x"', head=head))
    assert slot is not None and slot.head == head


def test_a_duplicated_key_proves_only_the_one_a_parser_keeps() -> None:
    """orjson keeps the last of two equal keys: the first is no slot (its probe is lost)."""
    payload = b'{"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}'
    slot = learned(payload)
    assert slot is not None
    assert slot.head == b'{"choices":[{"index":0,"delta":{"content":"a","content":'
    assert slot.text(payload.replace(b'"b"}', b'"c"}')) == "c"
    assert slot.text(payload.replace(b'"a"', b'"z"')) is None


def test_a_text_that_is_the_probe_gives_no_slot() -> None:
    assert learned(chunk(orjson.dumps(text_slot.PROBE))) is None


def test_a_string_that_is_not_the_text_gives_no_slot() -> None:
    obj = {"choices": [{"delta": {"content": 3}}]}
    assert text_slot.learn(b'{"choices":[{"delta":{"content":3}}]}', obj,
                           obj["choices"][0]["delta"], "content", 0) is None


def sse(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


ROLE = chunk(b'""', tail=TAIL).replace(b'{"content":', b'{"role":"assistant","content":')
FINISH = chunk(b'""', tail=b'},"logprobs":null,"finish_reason":"length","token_ids":null}]}')


def decode(dec: openai_decode.OpenAIDecoder, body: bytes) -> list[ev.Event]:
    return dec.feed(body) + dec.close()


def test_the_decoder_reads_a_plain_stream_by_its_slot_with_the_same_events() -> None:
    body = sse(ROLE, *(chunk(orjson.dumps(t)) for t in ("Hel", "lo", "", " wo", "rld")),
               FINISH, b"[DONE]")
    fast = openai_decode.OpenAIDecoder(True, True)
    full = openai_decode.OpenAIDecoder(True, True)
    full.fast = False
    assert decode(fast, body) == decode(full, body) == [
        ev.Role(0, "assistant"), ev.TextDelta(0, "Hel"), ev.TextDelta(0, "lo"),
        ev.TextDelta(0, " wo"), ev.TextDelta(0, "rld"), ev.Finish(0, "length")]
    assert fast._slot is not None and full._slot is None


def test_text_after_its_choice_finished_is_dropped_by_the_slot_too() -> None:
    """n=2: choice 0 ends, then a chunk with its bytes comes again; the full read drops it."""
    two = [chunk(orjson.dumps(t)) for t in ("a", "b")]
    other = chunk(b'"c"').replace(b'"index":0', b'"index":1')
    body = sse(two[0], FINISH, two[1], other,
               FINISH.replace(b'"index":0', b'"index":1'), b"[DONE]")
    dec = openai_decode.OpenAIDecoder(True, True, choices=2)
    assert decode(dec, body) == [ev.TextDelta(0, "a"), ev.Finish(0, "length"),
                                 ev.TextDelta(1, "c"), ev.Finish(1, "length")]
    assert dec._slot is not None


def test_a_completions_stream_learns_the_text_slot() -> None:
    base = (b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"demo",'
            b'"choices":[{"index":0,"text":%s,"logprobs":null,"finish_reason":null,'
            b'"stop_reason":null}]}')
    end = base.replace(b'"finish_reason":null', b'"finish_reason":"stop"') % b'""'
    body = sse(base % b'"Hel"', base % b'"lo"', end, b"[DONE]")
    dec = openai_decode.OpenAIDecoder(False, True)
    assert decode(dec, body) == [ev.TextDelta(0, "Hel"), ev.TextDelta(0, "lo"),
                                 ev.Finish(0, "eos")]
    assert dec._slot is not None and dec._slot.head.endswith(b'"text":')


def test_chunks_with_logprobs_or_token_ids_are_read_in_full() -> None:
    with_ids = [chunk(orjson.dumps(t), tail=b'},"logprobs":null,"finish_reason":null,'
                      b'"token_ids":[7]}]}') for t in ("a", "b")]
    dec = openai_decode.OpenAIDecoder(True, True)
    assert decode(dec, sse(*with_ids, FINISH, b"[DONE]")) == [
        ev.TextDelta(0, "a", [7]), ev.TextDelta(0, "b", [7]), ev.Finish(0, "length")]
    assert dec._slot is None


def test_tgi_messages_decoder_reads_every_event_in_full() -> None:
    """Its own `on_event` trims stop strings: no event may pass it by (any subclass with its
    own `on_event` reads in full; the compiled build allows no interpreted subclass)."""
    assert tgi_decode.TgiChatDecoder(True, ["lo"], False).fast is False
    assert openai_decode.OpenAIDecoder(True, True).fast is True
    assert openai_decode.OpenAIDecoder(True, False).fast is False  # a whole body: no stream



@pytest.mark.parametrize("inside", [b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"a\x01b", b"\t",
                                    b"a\x7fb", "\u2028".encode(), "🙂".encode()])
def test_a_string_read_without_the_parser_is_read_as_the_parser_reads_it(inside: bytes) -> None:
    """A string with no quote, backslash or control byte is decoded as UTF-8 without the
    parser; bytes that are not UTF-8 (a lone byte, a surrogate, an overlong form) and raw
    control bytes (which JSON forbids) still get the parser's answer: none."""
    slot = learned(chunk(b'"x"'))
    assert slot is not None
    try:
        expected = orjson.loads(b'"' + inside + b'"')
    except orjson.JSONDecodeError:
        expected = None
    assert slot.text(chunk(b'"' + inside + b'"')) == expected


@given(st.binary(max_size=10))
def test_any_bytes_in_the_slot_read_as_the_parser_reads_them(inside: bytes) -> None:
    slot = learned(chunk(b'"x"'))
    assert slot is not None
    literal = b'"' + inside + b'"'
    try:
        value = orjson.loads(literal)
        expected = value if type(value) is str else None
    except orjson.JSONDecodeError:
        expected = None
    assert slot.text(chunk(literal)) == expected
