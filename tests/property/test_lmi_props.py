"""Hypothesis: the LMI front end under any input.

- `lmi_json.dumps` writes exactly Python's `json.dumps(ensure_ascii=False)` (DJL's writer).
- Gson error bodies read back as {"error", "code"} with Gson's HTML-safe escapes.
- Any valid seed-003 body reaches canonical (and the vLLM request) with every parameter the
  canonical model carries.
- Arbitrary JSON yields an InferenceRequest or a 4xx in LMI's body, never a 5xx.
- Any split of a generation into deltas and upstream reads gives rolling-batch lines and chat
  chunks that validate against the wire models, whose texts join to the whole text, with
  generated_text and details on the last line only.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import base
from adapters.backends import vllm
from adapters.frontends import lmi, lmi_json
from schemas import canonical, errors
from schemas import events as ev
from schemas import lmi as wire

OPTIONS: dict[str, Any] = {"lmi": {"tgi_compat": False, "output_formatter": "jsonlines"}}
CTX = base.RequestContext("/invocations", {}, {}, lambda _: OPTIONS)
META = base.ResponseMeta("p", 1, "demo")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@given(json_values)
def test_dumps_is_pythons_json_dumps(value: Any) -> None:
    assert lmi_json.dumps(value) == json.dumps(value, ensure_ascii=False).encode()


@given(st.text(), st.integers(100, 599))
def test_gson_error_reads_back(message: str, code: int) -> None:
    body = lmi_json.gson_error(message, code)
    assert orjson.loads(body) == {"error": message, "code": code}
    assert not any(c in body for c in b"<>&='")


# parameter -> (strategy, vLLM request field or None when only canonical carries it)
PARAMS: dict[str, tuple[st.SearchStrategy[Any], str]] = {
    "max_new_tokens": (st.integers(1, 10**6), "max_tokens"),
    "seed": (st.integers(0, 2**32), "seed"),
    "repetition_penalty": (st.floats(0.01, 5), "repetition_penalty"),
    "top_k": (st.integers(-1, 100), "top_k"),
    "top_p": (st.floats(0.01, 1), "top_p"),
    "min_p": (st.floats(0, 1), "min_p"),
    "presence_penalty": (st.floats(-2, 2), "presence_penalty"),
    "frequency_penalty": (st.floats(-2, 2), "frequency_penalty"),
    "length_penalty": (st.floats(-2, 2), "length_penalty"),
    "truncate": (st.integers(1, 4096), "truncate_prompt_tokens"),
    "ignore_eos_token": (st.booleans(), "ignore_eos"),
    "stop_sequences": (st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=3),
                       "stop"),
    "stop_token_ids": (st.lists(st.integers(0, 10**5), min_size=1, max_size=3),
                       "stop_token_ids"),
    "min_length": (st.integers(0, 100), "min_tokens"),
    "skip_special_tokens": (st.booleans(), "skip_special_tokens"),
    "include_stop_str_in_output": (st.booleans(), "include_stop_str_in_output"),
    "spaces_between_special_tokens": (st.booleans(), "spaces_between_special_tokens"),
    "bad_sequences": (st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=2),
                      "bad_words"),
    "n": (st.integers(1, 4), "n"),
    "top_n_tokens": (st.integers(1, 5), "logprobs"),
}
# Parameters only the canonical model carries for this worker (vLLM's backend refuses them).
CANONICAL_ONLY: dict[str, tuple[st.SearchStrategy[Any], str]] = {
    "typical_p": (st.floats(0.01, 1), "typical_p"),
    "num_beams": (st.integers(1, 4), "num_beams"),
}
params = st.fixed_dictionaries({}, optional={k: v[0] for k, v in PARAMS.items()} | {
    k: v[0] for k, v in CANONICAL_ONLY.items()} | {
    "do_sample": st.booleans(), "temperature": st.floats(0, 2), "details": st.booleans(),
    "return_full_text": st.booleans(), "decoder_input_details": st.booleans()})


@given(params, st.booleans())
def test_valid_bodies_keep_every_parameter(p: dict[str, Any], stream: bool) -> None:
    if stream:
        for name in ("n", "num_beams", "decoder_input_details"):
            p.pop(name, None)
    t = lmi.LmiFrontend().parse(orjson.dumps({"inputs": "x", "parameters": p,
                                              "stream": stream}), CTX)
    req = t.request
    sent = orjson.loads(vllm.VllmBackend().build(req, base.Target("http://w", "m")).body)
    for name, value in p.items():
        if name in PARAMS:
            field = PARAMS[name][1]
            expected = value if field != "n" or value > 1 else None
            if field == "include_stop_str_in_output":  # canonical keep_stop: vLLM's default
                expected = True if value else None
            assert sent.get(field) == expected, name
        elif name in CANONICAL_ONLY:
            assert getattr(req.sampling, CANONICAL_ONLY[name][1]) == value, name
    assert sent["max_tokens"] == p.get("max_new_tokens", 30)
    if p.get("do_sample") is False:
        assert sent["temperature"] == 0.0
    elif "temperature" in p:
        assert sent["temperature"] == p["temperature"]
    if p.get("details") or stream:
        assert sent["return_token_ids"] is True and "logprobs" in sent
    if p.get("decoder_input_details"):
        assert sent["prompt_logprobs"] == 1
    assert t.state.full_text == bool(p.get("return_full_text"))


@settings(max_examples=300)
@given(st.one_of(json_values, st.fixed_dictionaries(
    {"inputs": json_values}, optional={"parameters": json_values, "stream": json_values}),
    st.fixed_dictionaries({"messages": json_values}), st.fixed_dictionaries(
        {"prompt": json_values}, optional={"max_tokens": json_values}),
    st.fixed_dictionaries({"inputs": st.text(), "parameters": st.dictionaries(
        st.sampled_from(sorted(wire.GenerationParameters.model_fields)), json_values)})))
def test_arbitrary_json_is_a_request_or_a_4xx(value: Any) -> None:
    fe = lmi.LmiFrontend()
    try:
        req = fe.parse(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS), CTX).request
    except errors.RequestError as exc:
        r = fe.render_error(exc)
        assert 400 <= r.status < 500
        assert set(orjson.loads(r.body)) >= {"error", "code"}
        return
    except orjson.JSONEncodeError:
        return  # not representable as a request body at all
    assert isinstance(req, canonical.InferenceRequest)


tokens = st.lists(st.tuples(st.text(max_size=4), st.floats(-20, 0, allow_nan=False)),
                  min_size=1, max_size=10)


def _deltas(toks: list[tuple[str, float]], sizes: list[int]) -> list[ev.TextDelta]:
    out, i, k = [], 0, 0
    while i < len(toks):
        part = toks[i:i + sizes[k % len(sizes)]]
        out.append(ev.TextDelta(0, "".join(t for t, _ in part),
                                [100 + i + j for j in range(len(part))],
                                [ev.TokenLogprob(t, lp) for t, lp in part]))
        i, k = i + len(part), k + 1
    return out


def _stream(body: dict[str, Any], deltas: list[ev.TextDelta], cuts: list[bool],
            finish_alone: bool) -> tuple[bytes, bool]:
    """The stream's bytes, with an upstream read ending after delta i where cuts[i]; and
    whether the Finish came in a read of its own (then DJL's stand-in token ends it)."""
    enc = lmi.LmiFrontend().parse(orjson.dumps(body), CTX).encoder(META)
    cuts = (cuts + [False] * len(deltas))[:len(deltas)]
    cuts[-1] = cuts[-1] or finish_alone
    out = b"".join(enc.encode(d) + (enc.flush() if cut else b"") for d, cut in zip(deltas, cuts))
    out += enc.encode(ev.Finish(0, "length")) + enc.flush() + enc.finish()
    return out, cuts[-1]


@given(tokens, st.lists(st.integers(1, 3), min_size=1, max_size=5),
       st.lists(st.booleans(), max_size=10), st.booleans(), st.booleans())
def test_rolling_stream_lines(toks: list[tuple[str, float]], sizes: list[int],
                              cuts: list[bool], finish_alone: bool, details: bool) -> None:
    body = {"inputs": "x", "stream": True, "parameters": {"details": details}}
    out, alone = _stream(body, _deltas(toks, sizes), cuts, finish_alone)
    lines = [wire.StreamLine.model_validate(orjson.loads(x)) for x in out.split(b"\n") if x]
    assert len(lines) == len(toks) + alone
    assert all(x.generated_text is None and x.details is None for x in lines[:-1])
    text = "".join(t for t, _ in toks)
    assert lines[-1].generated_text == text == "".join(x.token.text for x in lines)
    assert (lines[-1].details is not None) == details
    if details:
        assert lines[-1].details is not None and lines[-1].details.generated_tokens == len(toks)


@given(tokens, st.lists(st.integers(1, 3), min_size=1, max_size=5),
       st.lists(st.booleans(), max_size=10), st.booleans())
def test_chat_stream_chunks(toks: list[tuple[str, float]], sizes: list[int], cuts: list[bool],
                            finish_alone: bool) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "logprobs": True}
    out, _ = _stream(body, _deltas(toks, sizes), cuts, finish_alone)
    chunks = [wire.ChatCompletionChunk.model_validate(orjson.loads(x))
              for x in out.split(b"\n") if x]
    deltas = [c.choices[0] for c in chunks]
    assert deltas[0].delta.role == "assistant" and all(d.delta.role is None for d in deltas[1:])
    assert "".join(d.delta.content or "" for d in deltas) == "".join(t for t, _ in toks)
    assert [d.finish_reason for d in deltas] == [None] * (len(deltas) - 1) + ["length"]


chat_params = st.fixed_dictionaries({"messages": st.just([{"role": "user", "content": "x"}])}, optional={
    "max_tokens": st.integers(1, 10**5), "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1), "seed": st.integers(0, 2**31), "n": st.integers(1, 4),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "stop": st.lists(st.text(min_size=1, max_size=4), max_size=3), "ignore_eos": st.booleans(),
    "logit_bias": st.dictionaries(st.integers(0, 999).map(str), st.floats(-100, 100),
                                  max_size=2),
    "stream": st.booleans(), "user": st.text(max_size=5)})


@given(chat_params)
def test_valid_chat_bodies_keep_every_parameter(body: dict[str, Any]) -> None:
    """Seed 000's request fields reach the worker under their OpenAI names."""
    req = lmi.LmiFrontend().parse(orjson.dumps({**body, "model": "gpt2"}), CTX).request
    sent = orjson.loads(vllm.VllmBackend().build(req, base.Target("http://w", "m")).body)
    assert sent["messages"] == body["messages"] and sent["model"] == "m"
    for name in ("max_tokens", "temperature", "top_p", "seed", "presence_penalty",
                 "frequency_penalty", "ignore_eos", "logit_bias", "user"):
        assert sent.get(name) == body.get(name), name
    assert sent.get("stop", []) == body.get("stop", [])
    assert sent.get("n", 1) == body.get("n", 1) and sent["stream"] == body.get("stream", False)
