"""Hypothesis: OpenAI requests survive canonical form, and decoders are right for any chunking.

- Every chat/completions request the wire schema admits parses to canonical; built as a vLLM
  request and parsed again it gives the same canonical request (the vLLM worker speaks the
  OpenAI schema, so this is the canonical -> OpenAI -> canonical round trip). The one field the
  builder sets on purpose is `stream_options.include_usage` (usage is always asked upstream).
- Arbitrary JSON gives an InferenceRequest or InvalidRequest, nothing else.
- Our OpenAI encoder's bytes, cut anywhere, decode with our vLLM decoder to the same events.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import base
from adapters.backends import vllm
from adapters.frontends import openai as frontend
from adapters.frontends import tgi_chat
from schemas import canonical, errors
from schemas import events as ev

CTX = base.RequestContext()
text = st.text(max_size=12)
small_float = st.floats(min_value=0, max_value=1, allow_nan=False)
optional = st.none() | st.just(None)

content = st.none() | text | st.lists(st.fixed_dictionaries(
    {"type": st.just("text"), "text": text}), max_size=2)
tool_call = st.fixed_dictionaries({
    "id": text, "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": text, "arguments": text})})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]),
     "content": content},
    optional={"name": text, "tool_calls": st.lists(tool_call, max_size=2),
              "tool_call_id": text, "reasoning_content": text})
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": text}, optional={"description": text, "strict": st.booleans(),
                              "parameters": st.just({"type": "object", "properties": {}})})})

COMMON = {
    "model": text,
    "frequency_penalty": st.floats(-2, 2, allow_nan=False),
    "presence_penalty": st.floats(-2, 2, allow_nan=False),
    "logit_bias": st.dictionaries(st.integers(0, 999).map(str), st.floats(-100, 100), max_size=2),
    "max_tokens": st.integers(1, 4096),
    "n": st.integers(1, 4),
    "seed": st.integers(-(2**31), 2**31),
    # vLLM refuses an empty stop string (sampling_params.py), and so does the gateway
    "stop": text.filter(bool) | st.lists(text.filter(bool), max_size=3),
    "stream": st.booleans(),
    "temperature": st.floats(0, 2, allow_nan=False),
    "top_p": small_float,
    "user": text,
    "top_k": st.integers(-1, 100),
    "min_p": small_float,
    "repetition_penalty": st.floats(0.01, 2, allow_nan=False),
    "length_penalty": st.floats(-2, 2, allow_nan=False),
    "min_tokens": st.integers(0, 10),
    "stop_token_ids": st.lists(st.integers(0, 50000), max_size=3),
    "ignore_eos": st.booleans(),
    "best_of": st.integers(1, 4),
    "skip_special_tokens": st.booleans(),
    "truncate_prompt_tokens": st.integers(1, 1000),
    "prompt_logprobs": st.integers(0, 5),
    "return_token_ids": st.booleans(),
    "priority": st.integers(-5, 5),  # an extra vLLM field the canonical model does not carry
}
chat_request = st.fixed_dictionaries(
    # a model other than TGI's placeholders: without one the body is TGI's Messages API
    {"messages": st.lists(message, min_size=1, max_size=3),
     "model": text.filter(lambda m: m not in tgi_chat.PLACEHOLDERS)},
    optional={**{k: v for k, v in COMMON.items() if k != "model"},
              "logprobs": st.booleans(),
              "max_completion_tokens": st.integers(1, 4096),
              "tools": st.lists(tool, max_size=2),
              "tool_choice": st.sampled_from(["none", "auto", "required"]) | st.builds(
                  lambda n: {"type": "function", "function": {"name": n}}, text),
              "parallel_tool_calls": st.booleans(),
              "response_format": st.just({"type": "json_object"}),
              "reasoning_effort": st.sampled_from(["low", "medium", "high"])})
completion_request = st.fixed_dictionaries(
    {"prompt": text | st.lists(text, min_size=1, max_size=3)
     | st.lists(st.integers(0, 50000), min_size=1, max_size=4)},
    optional={**COMMON, "logprobs": st.integers(0, 5), "echo": st.booleans()})


def _fix_top_logprobs(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("logprobs") is True:
        d["top_logprobs"] = 2
    # a tool choice other than "none" names one of the tools (vLLM's check_tool_usage)
    choice = d.get("tool_choice")
    if choice is not None and choice != "none":
        name = choice["function"]["name"] if isinstance(choice, dict) else "f"
        d["tools"] = [*d.get("tools", ()), {"type": "function", "function": {"name": name}}]
    return d


def _without_usage_flag(req: canonical.InferenceRequest) -> canonical.InferenceRequest:
    return dataclasses.replace(req, include_usage=False)


def _round_trip(fe: Any, body: dict[str, Any]) -> None:
    req = fe.parse(orjson.dumps(body), CTX).request
    backend = vllm.VllmBackend()
    backend.check(req)
    target = base.Target("http://w", req.model if req.model is not None else "m")
    up = backend.build(req, target)
    again = fe.parse(up.body, CTX).request
    if req.model is None:
        again.model = None
    assert _without_usage_flag(again) == _without_usage_flag(req)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(chat_request.map(_fix_top_logprobs))
def test_chat_request_round_trips_through_canonical(body: dict[str, Any]) -> None:
    _round_trip(frontend.OpenAIChatFrontend(), body)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(completion_request)
def test_completion_request_round_trips_through_canonical(body: dict[str, Any]) -> None:
    _round_trip(frontend.OpenAICompletionsFrontend(), body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=10)
near_valid = chat_request.flatmap(lambda d: st.dictionaries(
    st.sampled_from(sorted(COMMON) + ["messages", "tools", "logprobs", "top_logprobs"]),
    json_values, max_size=3).map(lambda junk: {**d, **junk}))


@settings(max_examples=300)
@given(json_values | near_valid)
def test_arbitrary_json_gives_a_request_or_invalid_request(body: Any) -> None:
    for fe in (frontend.OpenAIChatFrontend(), frontend.OpenAICompletionsFrontend()):
        try:
            req = fe.parse(json.dumps(body).encode(), CTX).request
        except errors.InvalidRequest:
            continue
        assert isinstance(req, canonical.InferenceRequest)
        vllm.VllmBackend().build(req, base.Target("http://w", "m"))  # and it can be sent on


# ---- encoder -> decoder, any chunking ----

META = base.ResponseMeta("x", 1, "m")
STREAM = frontend.OpenAIChatFrontend().parse(
    b'{"model":"m","messages":[{"role":"user","content":"q"}],"stream":true,"logprobs":true,'
    b'"top_logprobs":1,"n":2,"stream_options":{"include_usage":true}}', CTX)
STREAM_REQ = STREAM.request

token = st.builds(lambda t, lp: ev.TokenLogprob(t, lp, list(t.encode()), None,
                                               [ev.TopLogprob(t + "x", lp - 1,
                                                              list((t + "x").encode()))]),
                  st.text(min_size=1, max_size=4), st.floats(-20, 0, allow_nan=False))
choice_events = st.lists(
    st.builds(lambda t, lp: ("text", t, lp), st.text(min_size=1, max_size=6), token)
    | st.builds(lambda t: ("reasoning", t, None), st.text(min_size=1, max_size=6)),
    max_size=6)


def _script(per_choice: list[list[tuple[str, str, Any]]],
            reasons: list[ev.FinishReason]) -> list[ev.Event]:
    out: list[ev.Event] = []
    for i, items in enumerate(per_choice):
        out.append(ev.Role(i))
        for kind, t, lp in items:
            out.append(ev.TextDelta(i, t, None, [lp]) if kind == "text"
                       else ev.ReasoningDelta(i, t))
        out.append(ev.Finish(i, reasons[i]))
    out.append(ev.Usage(3, sum(1 for items in per_choice for k, _, _ in items if k == "text")))
    return out


@settings(max_examples=200)
@given(st.lists(choice_events, min_size=2, max_size=2),
       st.lists(st.sampled_from(["eos", "length", "tool_calls"]), min_size=2, max_size=2),
       st.lists(st.integers(0, 4000), max_size=8))
def test_openai_encoder_bytes_decode_to_the_same_events_for_any_chunking(
        per_choice: list[list[tuple[str, str, Any]]], reasons: list[ev.FinishReason],
        cuts: list[int]) -> None:
    events = _script(per_choice, reasons)
    enc = STREAM.encoder(META)
    wire = b"".join(enc.encode(e) for e in events) + enc.finish()
    dec = vllm.VllmBackend().decoder(STREAM_REQ, streaming=True)
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    decoded = [e for a, b in zip(points, points[1:]) for e in dec.feed(wire[a:b])] + dec.close()
    assert decoded == events
