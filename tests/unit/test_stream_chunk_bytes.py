"""The per-chunk shortcuts of the stream path write the bytes the general path writes.

The OpenAI chat and completion encoders write a text-only chunk from bytes made once per
choice around one `orjson.dumps` of the text; the general path dumps the chunk's choice dict
(openai-python ChatCompletionChunk / Completion: `choices[].delta.content` or `.text`,
`logprobs`, `finish_reason`; vLLM serving_chat.py and serving_completion.py write the same keys
in this order). The relay skips `flush` for encoders that declare `holds_back = False`; those
must indeed never hold anything back.
"""
from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from adapters import base
from adapters.frontends import elastic_encode, openai_encode
from schemas import canonical
from schemas import events as ev

META = base.ResponseMeta("abc", 1700000000, "demo \"model\" é")
JSON_VALUES = st.one_of(st.text(), st.integers(), st.floats(allow_nan=False), st.none(),
                        st.booleans(), st.lists(st.integers(), max_size=3))


Encoder = openai_encode.ChatStreamEncoder | openai_encode.CompletionStreamEncoder


def _pair(req: canonical.InferenceRequest, chat: bool, es: bool) -> tuple[Encoder, Encoder]:
    """The encoder, and one whose text chunks are built from their dict as every other is."""
    def make() -> Encoder:
        return openai_encode.ChatStreamEncoder(req, META, es) if chat \
            else openai_encode.CompletionStreamEncoder(req, META)
    fast, slow = make(), make()
    slow._plain = False
    return fast, slow


@given(texts=st.lists(st.tuples(st.one_of(st.integers(0, 3), st.booleans(), st.just(1.0),
                                          st.just("0")), JSON_VALUES), max_size=8),
       include_usage=st.booleans(), elasticsearch=st.booleans(), chat=st.booleans())
def test_plain_text_chunks_equal_the_dict_built_ones(texts: list[tuple[Any, Any]],
                                                     include_usage: bool, elasticsearch: bool,
                                                     chat: bool) -> None:
    """Any text (a JSON value of any type) and any choice index (an int, or the odd `true`,
    `1.0` or `"0"` a broken worker writes; the OpenAI decoder refuses those, checked.text).
    Compiled, such an event cannot be made at all."""
    req = canonical.InferenceRequest(messages=[canonical.Message("user", "hi")], stream=True,
                                     include_usage=include_usage)
    fast, slow = _pair(req, chat, elasticsearch)
    assert fast._plain
    for choice, text in texts:
        try:
            e = ev.TextDelta(choice, text)
        except TypeError:  # compiled (setup.py), an event checks its own fields' types
            continue
        assert _outcome(fast, e) == _outcome(slow, e)
    assert fast.finish() == slow.finish()


def _outcome(enc: Encoder, e: ev.Event) -> bytes | str:
    """The bytes, or the error that a value orjson cannot write raises (the same either way)."""
    try:
        return enc.encode(e)
    except TypeError as exc:
        return repr(exc)


def test_the_shortcut_is_off_where_a_chunk_carries_more_than_text() -> None:
    for extra in ({"logprobs": True}, {"token_ids": True},
                  {"include_usage": True, "continuous_usage": True}):
        req = canonical.InferenceRequest(messages=[canonical.Message("user", "hi")],
                                         stream=True, **extra)
        assert not openai_encode.ChatStreamEncoder(req, META)._plain
        assert not openai_encode.CompletionStreamEncoder(req, META)._plain


EVENTS: list[ev.Event] = [ev.Role(0), ev.TextDelta(0, "a"), ev.ReasoningDelta(0, "r"),
                          ev.ToolCallDelta(0, 0, "id", "f", "{}"), ev.TextDelta(1, "b", [5]),
                          ev.Finish(0, "stop_string", "x"), ev.Finish(1, "length"),
                          ev.Usage(3, 2)]


def test_encoders_that_say_they_hold_nothing_back_flush_nothing() -> None:
    req = canonical.InferenceRequest(prompts=["p"], stream=True, include_usage=True)
    encoders = [openai_encode.ChatStreamEncoder(req, META),
                openai_encode.CompletionStreamEncoder(req, META),
                elastic_encode.ChatStreamEncoder(META, "server"),
                elastic_encode.CompletionStreamEncoder("documented")]
    for enc in encoders:
        assert enc.holds_back is False
        for e in EVENTS:
            enc.encode(e)
            assert enc.flush() == b""


def _dict_built(enc: elastic_encode.ChatStreamEncoder, e: ev.Event) -> bytes | str:
    """What Elastic's chat encoder writes for `e` with a text chunk built from its dict, as its
    other chunks are (a function, not a subclass: compiled, setup.py, the class has none)."""
    if not isinstance(e, ev.TextDelta):
        return _outcome(enc, e)
    enc._generated += len(e.token_ids) if e.token_ids is not None else 1
    try:
        return enc._delta(e.choice, {"content": e.text})
    except TypeError as exc:
        return repr(exc)


@given(texts=st.lists(st.tuples(st.one_of(st.integers(0, 3), st.booleans(), st.just(1.0),
                                          st.just("0")), JSON_VALUES), max_size=8),
       framing=st.sampled_from(["documented", "server"]))
def test_elastic_text_chunks_equal_the_dict_built_ones(texts: list[tuple[Any, Any]],
                                                       framing: elastic_encode.Framing) -> None:
    """Elastic's chat chunks (Elasticsearch's StreamingUnifiedChatCompletionResults
    ChatCompletionChunk: `delta` then `index`, the role chunk before a choice's first): a text
    chunk's bytes around one dumps of its text are the dict-built chunk's, in both framings."""
    fast = elastic_encode.ChatStreamEncoder(META, framing)
    slow = elastic_encode.ChatStreamEncoder(META, framing)
    for choice, text in texts:
        try:
            e = ev.TextDelta(choice, text)
        except TypeError:  # compiled (setup.py), an event checks its own fields' types
            continue
        assert _outcome(fast, e) == _dict_built(slow, e)
    fast.encode(ev.Usage(3, 4))
    slow.encode(ev.Usage(3, 4))
    assert fast.finish() == slow.finish()
