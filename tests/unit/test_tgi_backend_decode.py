"""The tgi worker protocol's answer side: /generate_stream events, /generate bodies and TGI's
chat API to canonical events; token ids, logprobs and details mapped; the stop sequence TGI
keeps cut off (whatever the chunking) and named; TGI's errors sorted into the error tree.
Bytes as TGI's router writes them (lib.rs, server.rs, chat.rs, infer/mod.rs @ db931fcf)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.backends import tgi_decode
from schemas import errors
from schemas import events as ev

SCRIPT = [(" The", 415), (" answer", 4372), (" is", 349), (" 42", 28705), (".", 28723)]


def stream_events(tokens: list[tuple[str, int]], reason: str = "eos_token",
                  special_last: bool = False, details: bool = True) -> bytes:
    out = []
    for i, (text, tid) in enumerate(tokens):
        last = i == len(tokens) - 1
        e: dict[str, Any] = {"index": i + 1, "token": {
            "id": tid, "text": text, "logprob": -0.25 * (i + 1),
            "special": special_last and last}}
        e["generated_text"] = "".join(t for t, _ in tokens[:-1 if special_last else None]) \
            if last else None
        e["details"] = {"finish_reason": reason, "generated_tokens": len(tokens), "seed": None,
                        "input_length": 7} if last and details else None
        out.append(b"data: " + orjson.dumps(e) + b"\n\n")
    return b"".join(out)


def decode(data: bytes, stop: list[str] | None = None, keep: bool = False,
           logprobs: bool = True) -> list[ev.Event]:
    dec = tgi_decode.TgiStreamDecoder(stop or [], keep, logprobs)
    return dec.feed(data) + dec.close()


def text_of(events: list[ev.Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, ev.TextDelta))


def finish_of(events: list[ev.Event]) -> ev.Finish:
    return next(e for e in events if isinstance(e, ev.Finish))


def test_tokens_carry_their_ids_and_logprobs_and_details_give_usage() -> None:
    events = decode(stream_events(SCRIPT[:2], "length"))
    assert events[0] == ev.TextDelta(0, " The", [415], [ev.TokenLogprob(" The", -0.25, None, 415, [], False)])
    assert finish_of(events) == ev.Finish(0, "length")
    assert events[-1] == ev.Usage(7, 2)


def test_top_tokens_become_alternatives() -> None:
    e = {"index": 1, "token": {"id": 5, "text": "a", "logprob": -0.1, "special": False},
         "top_tokens": [{"id": 5, "text": "a", "logprob": -0.1, "special": False},
                        {"id": 6, "text": "b", "logprob": None, "special": False}],
         "generated_text": "a", "details": None}
    delta = decode(b"data: " + orjson.dumps(e) + b"\n\n")[0]
    assert isinstance(delta, ev.TextDelta) and delta.logprobs is not None
    tops = delta.logprobs[0].top
    assert [(t.token, t.id) for t in tops] == [("a", 5), ("b", 6)]
    assert tops[1].logprob == float("-inf")  # serde_json writes an f32 NaN as null


def test_a_special_eos_token_keeps_its_id_text_and_flag_but_adds_no_text() -> None:
    """flash_causal_lm.py generate_token: the token's text is decoded with its special tokens
    (`</s>`) and flagged `special` (`all_special_ids`), generated_text without them
    (skip_special_tokens=True). The text is left out of the delta (what OpenAI clients see);
    the worker's token, flag included, stays with its logprob for TGI clients."""
    events = decode(stream_events([*SCRIPT[:2], ("</s>", 2)], special_last=True))
    assert text_of(events) == " The answer"
    assert events[2] == ev.TextDelta(0, "", [2], [ev.TokenLogprob("</s>", -0.75, None, 2,
                                                                     special=True)])
    assert finish_of(events).reason == "eos"


def test_the_stop_sequence_tgi_keeps_is_cut_and_named() -> None:
    events = decode(stream_events(SCRIPT, "stop_sequence"), stop=["\n", "."])
    assert text_of(events) == " The answer is 42"
    assert finish_of(events) == ev.Finish(0, "stop_string", ".")
    cut = [e for e in events if isinstance(e, ev.TextDelta)][-1]
    assert cut.text == "" and cut.token_ids == [28723]  # the stop token is still reported


def test_a_client_that_keeps_stop_strings_gets_tgis_text() -> None:
    events = decode(stream_events(SCRIPT, "stop_sequence"), stop=["."], keep=True)
    assert text_of(events) == " The answer is 42."
    assert finish_of(events) == ev.Finish(0, "stop_string", ".")


def test_a_stop_sequence_at_the_limit_is_cut_unless_the_client_keeps_it() -> None:
    """TGI's StoppingCriteria checks the length first (server/text_generation_server/utils/
    tokens.py `__call__`): a stop string the last allowed token completes is `length`, kept.
    A client that never sees stop strings gets vLLM's order (v1/engine/output_processor.py
    `process_outputs`: the stop string makes the finish STOP): cut, a stop."""
    events = decode(stream_events(SCRIPT, "length"), stop=["."])
    assert text_of(events) == " The answer is 42"
    assert finish_of(events) == ev.Finish(0, "stop_string", ".")
    kept = decode(stream_events(SCRIPT, "length"), stop=["."], keep=True)
    assert text_of(kept) == " The answer is 42." and finish_of(kept) == ev.Finish(0, "length")


def test_without_details_the_text_decides() -> None:
    events = decode(stream_events(SCRIPT, details=False), stop=["."])
    assert finish_of(events) == ev.Finish(0, "stop_string", ".")
    assert not any(isinstance(e, ev.Usage) for e in events)


def test_no_logprobs_when_not_asked() -> None:
    assert decode(stream_events(SCRIPT[:1]), logprobs=False)[0] == ev.TextDelta(0, " The", [415])


@pytest.mark.parametrize(("event", "kind", "status"), [
    ({"error": "Input validation error: `top_p` must be > 0.0 and < 1.0",
      "error_type": "validation"}, errors.UpstreamRejected, 422),
    ({"error": "Model is overloaded", "error_type": "overloaded"},
     errors.UpstreamUnavailable, 429),
    ({"error": "Request failed during generation: CUDA OOM", "error_type": "generation"},
     errors.UpstreamBroken, 502),
    ({"error": "Incomplete generation stream", "error_type": "incomplete_generation_stream"},
     errors.UpstreamBroken, 502),
])
def test_error_events_are_sorted_into_the_tree(event: dict[str, str],
                                               kind: type[errors.GatewayError],
                                               status: int) -> None:
    """server.rs: every error of /generate_stream is an event after HTTP 200."""
    with pytest.raises(kind) as exc:
        decode(b"data: " + orjson.dumps(event) + b"\n\n")
    assert exc.value.status == status
    assert not exc.value.message.startswith("Input validation error")


def test_tokens_before_an_error_event_go_out_first() -> None:
    dec = tgi_decode.TgiStreamDecoder([], False, False)
    events = dec.feed(stream_events(SCRIPT, details=False).split(b"\n\n")[0] + b"\n\n"
                      + b'data: {"error":"Request failed during generation: x",'
                        b'"error_type":"generation"}\n\n')
    assert text_of(events) == " The"
    with pytest.raises(errors.UpstreamBroken, match="during generation"):
        dec.close()


@pytest.mark.parametrize(("data", "why"), [
    (stream_events(SCRIPT)[:-1], "inside an event"),
    (stream_events(SCRIPT).rsplit(b"data:", 1)[0], "before its last token"),
    (b"data: {oops}\n\n", "malformed"),
    (b'data: {"index":1}\n\n', "not a token"),
])
def test_unfinished_or_malformed_streams_are_upstream_broken(data: bytes, why: str) -> None:
    with pytest.raises(errors.UpstreamBroken, match=why):
        decode(data)


@pytest.mark.parametrize(("status", "body", "kind", "out"), [
    (422, b'{"error":"Input validation error: `stop` supports up to 4 stop sequences. '
          b'Given: 5","error_type":"validation"}', errors.UpstreamRejected, 422),
    # a failed generation before the first byte: asked of another upstream (SPEC.md)
    (424, b'{"error":"Request failed during generation: boom","error_type":"generation"}',
     errors.UpstreamUnavailable, 502),
    (429, b'{"error":"Model is overloaded","error_type":"overloaded"}',
     errors.UpstreamUnavailable, 429),
    (500, b'{"error":"Incomplete generation","error_type":"incomplete_generation"}',
     errors.UpstreamUnavailable, 502),
    (422, b"Failed to deserialize the JSON body into the target type", errors.UpstreamRejected,
     422),
    # a 4xx whose error_type TGI never writes: still the request's fault, passed on (it was
    # "the worker failed", a 502, and not asked of another upstream either)
    (400, b'{"error":"m","error_type":[[1]]}', errors.UpstreamRejected, 400),
    (413, b'{"error":"m","error_type":"something_new"}', errors.UpstreamRejected, 413),
])
def test_http_errors_before_the_first_byte(status: int, body: bytes,
                                           kind: type[errors.GatewayError], out: int) -> None:
    exc = tgi_decode.http_error(status, body)
    assert type(exc) is kind and exc.status == out


def test_whole_generate_with_prefill_and_best_of() -> None:
    body = {"generated_text": " The answer.", "details": {
        "finish_reason": "stop_sequence", "generated_tokens": 3, "seed": None,
        "prefill": [{"id": 1, "text": "<s>", "logprob": None},
                    {"id": 9, "text": "Hi", "logprob": -2.5}],
        "tokens": [{"id": 415, "text": " The", "logprob": -0.5, "special": False},
                   {"id": 4372, "text": " answer", "logprob": -0.5, "special": False},
                   {"id": 28723, "text": ".", "logprob": -0.5, "special": False}],
        "best_of_sequences": [{"generated_text": " No", "finish_reason": "length",
                               "generated_tokens": 1, "seed": 3, "prefill": [],
                               "tokens": [{"id": 1770, "text": " No", "logprob": -1.0,
                                           "special": False}]}]}}
    dec = tgi_decode.TgiWholeDecoder(["."], False, True, None, 2)
    events = dec.feed(orjson.dumps(body)) + dec.close()
    # The first prompt token keeps its text; its logprob is NaN, which serde writes null
    # (flash_causal_lm.py generate_token, `request_prefill_logprobs`): none, as vLLM's first
    # prompt logprob is (an LMI client's `prefill` then says null from either worker)
    assert events[0] == ev.PromptInfo(0, [1, 9], [ev.TokenLogprob("<s>", None, None, 1),
                                                  ev.TokenLogprob("Hi", -2.5, None, 9)])
    texts = {e.choice: e for e in events if isinstance(e, ev.TextDelta)}
    assert texts[0].text == " The answer" and texts[0].token_ids == [415, 4372, 28723]
    assert texts[1].text == " No"
    assert [e for e in events if isinstance(e, ev.Finish)] == [
        ev.Finish(0, "stop_string", "."), ev.Finish(1, "length")]
    assert events[-1] == ev.Usage(2, 4)


# ---- TGI's chat API ----


def chat_chunk(content: str, finish: str | None = None) -> bytes:
    return b"data: " + orjson.dumps({
        "object": "chat.completion.chunk", "id": "", "created": 1, "model": "m",
        "system_fingerprint": "3.3.7-native", "choices": [{
            "index": 0, "delta": {"role": "assistant", "content": content}, "logprobs": None,
            "finish_reason": finish}], "usage": None}) + b"\n\n"


CHAT = b"".join([chat_chunk(" The"), chat_chunk(" 42"), chat_chunk(".", "stop_sequence"),
                 b"data: [DONE]\n\n"])


def chat_decode(data: bytes, stop: list[str], streaming: bool = True) -> list[ev.Event]:
    dec = tgi_decode.TgiChatDecoder(streaming, stop, False)
    return dec.feed(data) + dec.close()


def test_chat_stream_one_role_stop_sequence_cut() -> None:
    events = chat_decode(CHAT, ["."])
    assert [e for e in events if isinstance(e, ev.Role)] == [ev.Role(0)]
    assert text_of(events) == " The 42"
    assert finish_of(events) == ev.Finish(0, "stop_string", ".")


def test_chat_whole_tool_call_finishes_as_tool_calls() -> None:
    body = {"object": "chat.completion", "id": "", "created": 1, "model": "m",
            "system_fingerprint": "x", "choices": [{"index": 0, "message": {
                "role": "assistant", "tool_calls": [{"id": "0", "type": "function", "function": {
                    "description": None, "name": "f", "arguments": "{\"a\":1}"}}]},
                "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    events = chat_decode(orjson.dumps(body), [], streaming=False)
    assert ev.ToolCallDelta(0, 0, "0", "f", '{"a":1}') in events
    assert finish_of(events) == ev.Finish(0, "tool_calls")


@pytest.mark.parametrize(("message", "kind"), [
    ("Input validation error: `top_p` must be > 0.0 and < 1.0", errors.UpstreamRejected),
    ("Model is overloaded", errors.UpstreamUnavailable),
    ("Request failed during generation: x", errors.UpstreamBroken),
])
def test_chat_error_events_are_always_422_so_the_message_decides(
        message: str, kind: type[errors.GatewayError]) -> None:
    """infer/mod.rs into_openai_event: `http_status_code` is 422 whatever the error."""
    data = b"data: " + orjson.dumps({"error": {"message": message, "http_status_code": 422}}) \
        + b"\n\ndata: [DONE]\n\n"
    with pytest.raises(kind):
        chat_decode(data, [])


def test_a_chat_error_event_without_message_text_shows_no_repr() -> None:
    """A worker's error object whose `message` is not text (not TGI's, but not trusted either)
    was rendered as its Python repr; the client reads a plain failure instead."""
    data = b'data: {"error": {"message": {"trace": "/srv/x.py"}}}\n\ndata: [DONE]\n\n'
    with pytest.raises(errors.UpstreamBroken) as info:
        chat_decode(data, [])
    assert "trace" not in info.value.message and "{" not in info.value.message


# ---- any chunking ----

tokens = st.lists(st.sampled_from([("a", 1), ("b", 2), ("ab", 3), (".", 4), ("\n", 5),
                                   (" x", 6)]), min_size=1, max_size=8)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def stops_at(toks: list[tuple[str, int]], stop: list[str]) -> tuple[list[tuple[str, int]], str]:
    """Where TGI's StoppingCriteria would end this script (utils/tokens.py)."""
    text = ""
    for i, (t, _) in enumerate(toks):
        text += t
        if any(text.endswith(s) for s in stop):
            return toks[:i + 1], "stop_sequence"
    return toks, "eos_token"


@given(toks=tokens, stop=st.lists(st.sampled_from(["ab", "b.", "\n", "aa", "."]), max_size=3),
       cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_any_chunking_gives_the_same_events_without_the_stop_sequence(
        toks: list[tuple[str, int]], stop: list[str], cuts: list[int]) -> None:
    script, reason = stops_at(toks, stop)
    data = stream_events(script, reason)
    whole = decode(data, stop=stop)
    dec = tgi_decode.TgiStreamDecoder(stop, False, True)
    assert [e for p in split_at(data, cuts) for e in dec.feed(p)] + dec.close() == whole
    full = "".join(t for t, _ in script)
    finish = finish_of(whole)
    assert sum(len(e.token_ids or []) for e in whole if isinstance(e, ev.TextDelta)) == len(script)
    if reason == "stop_sequence":
        assert isinstance(finish.matched, str) and text_of(whole) + finish.matched == full
    else:
        assert finish.reason == "eos" and text_of(whole) == full


@given(cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_chat_any_chunking(cuts: list[int]) -> None:
    dec = tgi_decode.TgiChatDecoder(True, ["."], False)
    assert [e for p in split_at(CHAT, cuts) for e in dec.feed(p)] + dec.close() == \
        chat_decode(CHAT, ["."])


# ---- tool calls as TGI wrote them before v3.2.0 ----

def _legacy_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return b"data: " + orjson.dumps({
        "object": "chat.completion.chunk", "id": "", "created": 1, "model": "m",
        "system_fingerprint": "3.1.0-native", "choices": [{"index": 0, "delta": delta,
                                                            "logprobs": None,
                                                            "finish_reason": finish}],
        "usage": None}) + b"\n\n"


LEGACY_RAW = '{"function": {"_name": "get_weather", "location": "Paris", "unit": "C"}}'
LEGACY_STREAM = b"".join(
    _legacy_chunk({"role": "assistant", "tool_calls": {
        "index": 0, "id": "", "type": "function",
        "function": {"name": None, "arguments": LEGACY_RAW[k:k + 7]}}})
    for k in range(0, len(LEGACY_RAW), 7)
) + _legacy_chunk({"role": "assistant", "content": ""}, "eos_token") + b"data: [DONE]\n\n"


@given(cuts=st.lists(st.integers(0, len(LEGACY_STREAM)), max_size=6))
def test_a_pre_3_2_tool_call_stream_becomes_one_named_call(cuts: list[int]) -> None:
    """TGI v3.1.0 lib.rs: a delta's `tool_calls` is one object (a list from v3.2.0, #3076),
    named null, its `arguments` the grammar's raw `{"function": {"_name": ...}}` text
    (server.rs chat_completions @ v3.1.0); OpenAI clients need a list, a name and arguments."""
    dec = tgi_decode.TgiChatDecoder(True, [], False)
    events: list[ev.Event] = []
    prev = 0
    for cut in [*sorted(cuts), len(LEGACY_STREAM)]:
        events += dec.feed(LEGACY_STREAM[prev:cut])
        prev = cut
    events += dec.close()
    calls = [e for e in events if isinstance(e, ev.ToolCallDelta)]
    assert calls == [ev.ToolCallDelta(0, 0, "0", "get_weather",
                                      '{"location":"Paris","unit":"C"}')]
    assert finish_of(events) == ev.Finish(0, "tool_calls")


def test_a_pre_3_2_whole_tool_call_has_its_arguments_as_text() -> None:
    """TGI before v3.2.0 serialized FunctionDefinition.arguments as a JSON object (lib.rs;
    `serialize_as_string` came with #3076): clients parse a string."""
    body = orjson.dumps({
        "object": "chat.completion", "id": "", "created": 1, "model": "m",
        "system_fingerprint": "3.1.0-native", "choices": [{"index": 0, "message": {
            "role": "assistant", "tool_calls": [{"id": "0", "type": "function", "function": {
                "description": None, "name": "get_weather",
                "arguments": {"location": "Paris"}}}]},
            "logprobs": None, "finish_reason": "eos_token"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}})
    dec = tgi_decode.TgiChatDecoder(False, [], False)
    dec.feed(body)
    events = dec.close()
    assert [e for e in events if isinstance(e, ev.ToolCallDelta)] == [
        ev.ToolCallDelta(0, 0, "0", "get_weather", '{"location":"Paris"}')]
    assert finish_of(events) == ev.Finish(0, "tool_calls")


def test_a_pre_3_2_tool_call_that_is_not_json_is_a_worker_failure() -> None:
    body = _legacy_chunk({"role": "assistant", "tool_calls": {
        "index": 0, "id": "", "type": "function",
        "function": {"name": None, "arguments": '{"function": {"loc'}}}) + _legacy_chunk(
        {"role": "assistant", "content": ""}, "length") + b"data: [DONE]\n\n"
    dec = tgi_decode.TgiChatDecoder(True, [], False)
    with pytest.raises(errors.UpstreamBroken):
        dec.feed(body)
        dec.close()
