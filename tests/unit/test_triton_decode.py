"""The triton worker protocol's answer side: finish reasons inferred (token count against the
limit, a matched stop word, else a natural end), stop words cut off whatever the chunking,
usage from `num_*_tokens`, and every way a Triton stream can fail. Worker bytes as
src/http_server.cc writes them (`data: ` + JSON + blank line, keys in byte order, no terminator)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.backends import stops, triton_decode
from schemas import errors
from schemas import events as ev


def resp(text: str, n: int | None = 1, prompt: int | None = 5) -> dict[str, Any]:
    out: dict[str, Any] = {"cum_log_probs": 0.0, "model_name": "ensemble", "model_version": "1",
                           "output_log_probs": -0.5, "sequence_end": False, "sequence_id": 0,
                           "sequence_start": False, "text_output": text}
    if n is not None:
        out["num_output_tokens"] = n
    if prompt is not None:
        out["num_input_tokens"] = prompt
    return {k: out[k] for k in sorted(out)}


def sse(*responses: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(r) + b"\n\n" for r in responses)


def decode(data: bytes, limit: int = 100, stop: list[str] | None = None, keep: bool = False,
           streaming: bool = True, echo: str | None = None) -> list[ev.Event]:
    dec = triton_decode.TritonDecoder(streaming, limit, stop or [], keep, echo)
    return dec.feed(data) + dec.close()


def text_of(events: list[ev.Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, ev.TextDelta))


def finish_of(events: list[ev.Event]) -> ev.Finish:
    return next(e for e in events if isinstance(e, ev.Finish))


WORDS = [" The", " answer", " is", " 42", ".", "\n"]
STREAM = sse(*(resp(w) for w in WORDS))


def test_a_natural_end_is_eos_with_usage_from_the_counts() -> None:
    events = decode(STREAM)
    assert text_of(events) == "".join(WORDS)
    assert finish_of(events) == ev.Finish(0, "eos")
    assert events[-1] == ev.Usage(5, 6)


def test_the_token_count_reaching_the_limit_is_length() -> None:
    assert finish_of(decode(STREAM, limit=6)).reason == "length"
    assert finish_of(decode(STREAM, limit=7)).reason == "eos"


def test_a_stop_word_at_the_limit_is_a_stop_cut_for_a_client_that_never_sees_one() -> None:
    """vLLM's order (v1/engine/output_processor.py `process_outputs`: a stop string the
    detokenizer finds makes the finish STOP, whatever the scheduler capped): OpenAI and
    Elastic clients never see a matched stop string (SPEC.md), at the limit neither."""
    events = decode(sse(*(resp(w) for w in WORDS[:5])), limit=5, stop=["."])
    assert finish_of(events) == ev.Finish(0, "stop_string", ".")
    assert text_of(events) == " The answer is 42"


def test_length_wins_over_a_stop_word_at_the_limit_for_a_client_that_keeps_it() -> None:
    """As TGI's StoppingCriteria checks the length first; the text is then the worker's own."""
    events = decode(sse(*(resp(w) for w in WORDS[:5])), limit=5, stop=["."], keep=True)
    assert finish_of(events).reason == "length" and text_of(events).endswith(".")


def test_a_stop_word_the_worker_kept_is_cut_and_named() -> None:
    events = decode(sse(*(resp(w) for w in WORDS[:5])), stop=["\n", "."])
    assert text_of(events) == " The answer is 42"
    assert finish_of(events) == ev.Finish(0, "stop_string", ".")


def test_a_client_that_keeps_stop_strings_gets_it_whole() -> None:
    events = decode(sse(*(resp(w) for w in WORDS[:5])), stop=["."], keep=True)
    assert text_of(events) == " The answer is 42."
    assert finish_of(events) == ev.Finish(0, "stop_string", ".")


def test_a_stop_word_split_over_responses_is_held_until_it_is_known() -> None:
    dec = triton_decode.TritonDecoder(True, 100, ["is 4"], False)
    first = dec.feed(sse(resp(" The"), resp(" answer"), resp(" is")))
    assert text_of(first) == " The answer"  # " is" might begin the stop word
    assert dec.feed(sse(resp(" 4"))) == []
    rest = dec.close()
    assert text_of(first + rest) == " The answer "
    assert finish_of(rest) == ev.Finish(0, "stop_string", "is 4")


def test_without_counts_the_responses_are_counted_by_their_logprobs_and_no_usage() -> None:
    events = decode(sse(*(resp(w, n=None, prompt=None) for w in WORDS[:3])), limit=3)
    assert finish_of(events).reason == "length"
    assert not any(isinstance(e, ev.Usage) for e in events)


def legacy(text: str, tokens_so_far: int) -> dict[str, Any]:
    """A response of a 2024-era ensemble: the C++ tensorrtllm backend sent `output_log_probs`
    of the whole sequence so far (zeros, unasked) and the postprocessing model passed dummy
    logits; no `num_*_tokens` outputs (those came with TensorRT-LLM 0.17's config)."""
    lps: Any = 0.0 if tokens_so_far == 1 else [0.0] * tokens_so_far
    return {"context_logits": 0.0, "cum_log_probs": 0.0, "generation_logits": 0.0,
            "model_name": "ensemble", "model_version": "1", "output_log_probs": lps,
            "sequence_end": False, "sequence_id": 0, "sequence_start": False,
            "text_output": text}


def test_logprobs_of_the_sequence_so_far_count_each_response_once() -> None:
    """A recorded ensemble stream (tutorial "llama3 on Triton + TensorRT-LLM", generate_stream
    of "How do I count to nine in French?"): `text_output` is each response's new text while
    `output_log_probs` grows by one per response (0.0, [0.0,0.0], [0.0,0.0,0.0], ...): the
    count is its growth, not its length, or the limit is met early and the answer cut."""
    words = ["**\n", "To", " count", " to", " nine"]
    events = decode(sse(*(legacy(w, i + 1) for i, w in enumerate(words))), limit=6)
    assert text_of(events) == "".join(words)
    assert finish_of(events).reason == "eos"
    assert finish_of(decode(sse(*(legacy(w, i + 1) for i, w in enumerate(words))),
                            limit=5)).reason == "length"


def test_whole_answers_are_one_object() -> None:
    body = orjson.dumps(resp(" The answer is 42.", n=5, prompt=4))
    assert decode(body, limit=5, stop=["."], streaming=False, keep=True) == [
        ev.TextDelta(0, " The answer is 42."), ev.Finish(0, "length"), ev.Usage(4, 5)]
    assert decode(body, limit=5, streaming=False) == [
        ev.TextDelta(0, " The answer is 42."), ev.Finish(0, "length"), ev.Usage(4, 5)]
    assert decode(body, limit=9, stop=["."], streaming=False) == [
        ev.TextDelta(0, " The answer is 42"), ev.Finish(0, "stop_string", "."), ev.Usage(4, 5)]


def test_echo_puts_the_prompt_first() -> None:
    events = decode(STREAM, echo="Q:")
    assert events[0] == ev.TextDelta(0, "Q:") and text_of(events).startswith("Q: The")


def test_an_error_event_after_responses_ends_the_stream_after_them() -> None:
    """extension_generate.md: a later failure is an error object under HTTP 200."""
    dec = triton_decode.TritonDecoder(True, 100, [], False)
    events = dec.feed(sse(resp(" The")) + b'data: {"error":"Executor failed"}\n\n')
    assert text_of(events) == " The"
    with pytest.raises(errors.UpstreamBroken, match="Executor failed"):
        dec.close()


@pytest.mark.parametrize(("data", "why"), [
    (STREAM[:-1], "inside an event"),  # the last blank line never came
    (STREAM[:-2], "inside an event"),
    (b"", "no response"),
    (b"data: {not json}\n\n", "malformed"),
    (b'data: {"model_name":"ensemble"}\n\n', "text_output"),
    (b"data: [1]\n\n", "not a JSON object"),
])
def test_broken_streams_raise_upstream_broken(data: bytes, why: str) -> None:
    with pytest.raises(errors.UpstreamBroken, match=why):
        decode(data)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"error":"bad"}', "bad"), (b'data: {"error":"late"}\n\n', "late"),
    (b"<html>oops</html>", ""),  # not JSON: no message for a client (the log gets the body)
    (b'{"error":{"code":3,"trace":"/opt/x.py"}}', ""), (b'{"model_name":"e"}', "")])
def test_error_messages_are_read_from_every_error_shape(body: bytes, message: str) -> None:
    assert triton_decode.error_message(body) == message


# ---- any chunking, any stop word ----

pieces = st.lists(st.sampled_from(["a", "b", "ab", "ba", " ", ".", "\n", "aab", "x"]),
                  min_size=1, max_size=10)
stop_words = st.lists(st.sampled_from(["ab", "b.", "\n", "aa", "x a", "."]), max_size=3)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@given(texts=pieces, stop=stop_words, cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_any_chunking_gives_the_same_events_and_never_a_trailing_stop(
        texts: list[str], stop: list[str], cuts: list[int]) -> None:
    data = sse(*(resp(t) for t in texts))
    whole = decode(data, stop=stop)
    dec = triton_decode.TritonDecoder(True, 100, stop, False)
    chunked = [e for part in split_at(data, cuts) for e in dec.feed(part)] + dec.close()
    assert chunked == whole
    full, finish = "".join(texts), finish_of(whole)
    if finish.reason == "stop_string":
        assert isinstance(finish.matched, str) and full.endswith(finish.matched)
        assert text_of(whole) + finish.matched == full
    else:
        assert text_of(whole) == full and not any(full.endswith(s) for s in stop)


@given(texts=pieces, stop=stop_words)
def test_the_trimmer_releases_exactly_the_text_before_the_match(texts: list[str],
                                                                stop: list[str]) -> None:
    trim = stops.StopTrimmer(stop)
    out = [d for t in texts for d in trim.push(ev.TextDelta(0, t))]
    matched = trim.matched()
    out += trim.release(matched)
    full = "".join(texts)
    assert text_of(list(out)) + (matched or "") == full


def test_reaching_the_limit_finishes_with_that_response_not_at_the_streams_end() -> None:
    """Triton's stream has no end marker (src/http_server.cc writes one `data:` event per
    model response and then ends the chunked body); the count reaching the `max_tokens` sent
    is the end all the same, so the finish and usage come in the read of the last response."""
    dec = triton_decode.TritonDecoder(True, 3, [], False)
    reads = [dec.feed(sse(resp(w))) for w in (" The", " answer", " is")]
    assert [type(e) for e in reads[1]] == [ev.TextDelta]
    assert reads[2] == [ev.TextDelta(0, " is"), ev.Finish(0, "length"), ev.Usage(5, 3)]
    assert dec.feed(sse(resp("", n=0))) == []  # an empty last response changes nothing
    assert dec.close() == []


def test_a_tgi_stream_from_triton_ends_on_its_last_token_read_by_read() -> None:
    """TGI's /generate_stream puts `generated_text` on the last token's own event (router
    src/server.rs generate_stream_internal: one event per token, the last with the text), so
    `max_new_tokens` tokens are that many events, also when each worker response is its own
    read: no extra empty token after them."""
    from adapters.frontends import tgi_encode

    dec = triton_decode.TritonDecoder(True, 3, [], False)
    enc = tgi_encode.StreamEncoder(tgi_encode.TgiState(details=True))
    out = b""
    for word in (" The", " answer", " is"):
        out += b"".join(enc.encode(e) for e in dec.feed(sse(resp(word)))) + enc.flush()
    out += b"".join(enc.encode(e) for e in dec.close()) + enc.flush() + enc.finish()
    events = [orjson.loads(line[6:]) for line in out.split(b"\n\n") if line]
    assert [e["token"]["text"] for e in events] == [" The", " answer", " is"]
    assert events[-1]["generated_text"] == " The answer is"
    assert events[-1]["details"] == {"finish_reason": "length", "generated_tokens": 3,
                                     "seed": None, "input_length": 5}
