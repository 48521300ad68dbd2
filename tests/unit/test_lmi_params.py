"""LMI request parsing: every seed-003 GenerationParameter onto the worker's fields, LMI's
defaults, schema dispatch by body, the model a route serves, and what is refused (424).

Sources: seed 003 (GenerationParameters: common, LMI-dist, vLLM and TensorRT-LLM blocks, the
0.32 note on inferring do_sample), DJL Serving v0.36.0 `vllm_rolling_batch.py
translate_vllm_params` and `trtllm_rolling_batch.py translate_triton_params`, `input_parser.py`.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from adapters import base, registry
from adapters.backends import openai as openai_backend
from adapters.backends import trtllm, vllm
from adapters.frontends import lmi, lmi_params
from schemas import canonical, errors
from schemas import lmi as wire

TARGET = base.Target("http://w:8000", "org/model")


def ctx(path: str = "/invocations", **lmi_opts: Any) -> base.RequestContext:
    params = {"model": path.rsplit("/", 1)[1]} if path.startswith("/predictions/") else {}
    def options(name: str | None) -> dict[str, Any]:
        return {"lmi": {"tgi_compat": False, "output_formatter": "jsonlines", **lmi_opts}}

    return base.RequestContext(path, params, {}, options)


def translate(body: dict[str, Any], c: base.RequestContext | None = None) -> lmi.LmiTranslator:
    return lmi.LmiFrontend().parse(orjson.dumps(body), c or ctx())


def parse(body: dict[str, Any], c: base.RequestContext | None = None) -> canonical.InferenceRequest:
    return translate(body, c).request


def upstream(body: dict[str, Any], backend: Any = None) -> dict[str, Any]:
    req = parse(body)
    b = backend or vllm.VllmBackend()
    b.check(req)
    out: dict[str, Any] = orjson.loads(b.build(req, TARGET).body)
    return out


def inputs(**params: Any) -> dict[str, Any]:
    return {"inputs": "What is Deep Learning?", "parameters": params}


def test_defaults_are_lmi_defaults() -> None:
    """max_new_tokens 30 and greedy decoding, as seed 003 and translate_vllm_params set them."""
    sent = upstream({"inputs": "Hi"})
    assert sent["max_tokens"] == 30 and sent["temperature"] == 0.0
    assert sent["prompt"] == "Hi" and sent["stream"] is False
    assert "logprobs" not in sent and "return_token_ids" not in sent


# (LMI parameter, value, upstream vLLM field, expected value there)
RENAMES = [
    ("max_new_tokens", 7, "max_tokens", 7),
    ("stop_sequences", ["\n"], "stop", ["\n"]),
    ("stop_sequences", "END", "stop", ["END"]),
    ("stop", ["###"], "stop", ["###"]),  # TensorRT-LLM block, read as stop sequences
    ("ignore_eos_token", True, "ignore_eos", True),
    ("seed", "42", "seed", 42),  # DJL: int(parameters["seed"])
    ("seed", 7, "seed", 7),
    ("top_k", 20, "top_k", 20),
    ("top_p", 0.5, "top_p", 0.5),
    ("min_p", 0.1, "min_p", 0.1),
    ("repetition_penalty", 1.2, "repetition_penalty", 1.2),
    ("presence_penalty", 0.5, "presence_penalty", 0.5),
    ("frequency_penalty", -0.5, "frequency_penalty", -0.5),
    ("length_penalty", 0.8, "length_penalty", 0.8),
    ("truncate", 100, "truncate_prompt_tokens", 100),
    ("stop_token_ids", [2, 3], "stop_token_ids", [2, 3]),
    ("skip_special_tokens", False, "skip_special_tokens", False),
    ("min_length", 4, "min_tokens", 4),  # TensorRT-LLM block
    ("min_tokens", 5, "min_tokens", 5),
    ("include_stop_str_in_output", True, "include_stop_str_in_output", True),
    ("spaces_between_special_tokens", False, "spaces_between_special_tokens", False),
    ("early_stopping", True, "early_stopping", True),
    ("bad_sequences", ["bad"], "bad_words", ["bad"]),  # TensorRT-LLM block
    ("bad_words", ["worse"], "bad_words", ["worse"]),
    ("allowed_token_ids", [5, 6], "allowed_token_ids", [5, 6]),
    ("logit_bias", {"5": -100.0}, "logit_bias", {"5": -100.0}),
    ("best_of", 3, "n", 3),  # best_of without n: n = best_of (translate_vllm_params)
    ("best_of", 3, "best_of", 3),
    ("n", 2, "n", 2),
    ("top_n_tokens", 3, "logprobs", 3),
    ("logprobs", 2, "logprobs", 2),
    ("prompt_logprobs", 2, "prompt_logprobs", 2),
    ("decoder_input_details", True, "prompt_logprobs", 1),
]


@pytest.mark.parametrize(("name", "value", "field", "expected"), RENAMES,
                         ids=[f"{r[0]}->{r[2]}" for r in RENAMES])
def test_every_parameter_reaches_its_vllm_field(name: str, value: Any, field: str,
                                                expected: Any) -> None:
    assert upstream(inputs(**{name: value}))[field] == expected


def test_refused_by_vllm_with_a_4xx_naming_them() -> None:
    """typical_p (LMI-dist) has no vLLM OpenAI field: the backend refuses."""
    with pytest.raises(errors.Unsupported, match="typical_p"):
        upstream(inputs(typical_p=0.5))


def test_num_beams_is_vllm_beam_search_returning_every_beam() -> None:
    """Seed 003: vLLM decodes "Greedy (Default), Sampling, and Beam search"; `num_beams` > 1
    enables it and its beams come back as best_of_sequences. DJL's vLLM handler turns it into
    best_of with beam search (translate_vllm_params), best_of without n giving n; vLLM's
    OpenAI server takes `use_beam_search` with the beam width in `n` (protocol.py
    to_beam_search_params)."""
    t = translate(inputs(num_beams=3, max_new_tokens=4))
    assert t.state.multi and t.request.sampling.n == 3
    sent = upstream(inputs(num_beams=3, max_new_tokens=4))
    assert (sent["use_beam_search"], sent["n"]) == (True, 3)
    assert "use_beam_search" not in upstream(inputs(num_beams=1))
    for kind in ("tgi", "triton"):  # no beams there: a 4xx naming the field
        with pytest.raises(errors.Unsupported):
            registry.backend(kind).check(parse(inputs(num_beams=2)))


# Seed 003 GenerationParameters at the defaults it documents (common, LMI-dist / vLLM and
# TensorRT-LLM blocks): a client that writes them out asks for nothing.
SEED_DEFAULTS: dict[str, Any] = {
    "do_sample": False, "temperature": 1.0, "repetition_penalty": 1.0, "top_k": 0,
    "top_p": 1.0, "max_new_tokens": 30, "details": False, "return_full_text": False,
    "decoder_input_details": False, "typical_p": 1.0, "ignore_eos_token": False,
    "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "n": 1, "best_of": 1,
    "num_beams": 1, "length_penalty": 1.0, "early_stopping": False,
    "include_stop_str_in_output": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
}
BACKENDS = ("vllm", "trtllm", "triton", "tgi", "openai")


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("name", [*SEED_DEFAULTS, "top_k=-1"])
def test_a_parameter_at_its_seed_default_is_taken_by_every_worker(name: str, kind: str) -> None:
    """Seed 003 GenerationParameters: `typical_p` (default 1.0), `num_beams` (1), `min_p`
    (0.0), `top_k` (0; vLLM block -1) ... at their documented defaults decode as if absent, so
    no worker refuses them, although a vLLM or plain OpenAI server has no `typical_p` /
    `num_beams` field and TGI / Triton no `min_p` (a value that asks for something is still
    refused: test_refused_by_vllm_with_a_4xx_naming_them)."""
    key, _, value = name.partition("=")
    params = {key: int(value) if value else SEED_DEFAULTS[key]}
    req = parse(inputs(**params))
    registry.backend(kind).check(req)


@pytest.mark.parametrize(("kind", "sent"), [
    ("vllm", True), ("triton", True), ("trtllm", False), ("tgi", False), ("openai", False)])
def test_banned_words_reach_the_worker_or_are_refused(kind: str, sent: bool) -> None:
    """Seed 003 TensorRT-LLM block `bad_sequences` (vLLM SamplingParams `bad_words`; Triton's
    ensemble input `bad_words`) bans words from the answer: a worker without it refuses it
    with a 4xx naming it, never drops it (the answer would contain a banned word unsaid);
    likewise vLLM's `allowed_token_ids`."""
    for name, value in (("bad_sequences", ["Deep"]), ("allowed_token_ids", [1, 2])):
        req = parse(inputs(**{name: value}))
        backend = registry.backend(kind)
        if not sent or name == "allowed_token_ids" and kind == "triton":
            with pytest.raises(errors.Unsupported) as caught:
                backend.check(req)
            assert caught.value.field in ("bad_words", "allowed_token_ids")
            continue
        backend.check(req)
        body = orjson.loads(backend.build(req, TARGET).body)
        assert body[name.replace("bad_sequences", "bad_words")] == value


@pytest.mark.parametrize(("kind", "params", "named"), [
    ("tgi", {"ignore_eos_token": True}, "parameters.ignore_eos_token"),
    ("tgi", {"min_length": 3}, "parameters.min_length"),
    ("openai", {"bad_sequences": ["x"]}, "parameters.bad_sequences"),
    ("triton", {"details": True, "decoder_input_details": True},
     "parameters.decoder_input_details"),
    ("vllm", {"typical_p": 0.5}, "parameters.typical_p"),
    ("dynamic", {"typical_p": 0.5}, "parameters.typical_p"),
])
def test_a_refused_parameter_is_named_as_the_client_wrote_it(kind: str, params: dict[str, Any],
                                                             named: str) -> None:
    """Seed 003's parameter names differ from the worker fields they become (ignore_eos_token
    -> ignore_eos, min_length -> min_tokens, bad_sequences -> bad_words, decoder_input_details
    -> prompt_logprobs): the 424 a worker's refusal gives names the parameter the client sent,
    in both LMI error bodies (seed 003 Error Responses)."""
    body = inputs(**params)
    if kind == "dynamic":
        body, kind = {**body, "inputs": ["a", "b"]}, "vllm"
    t = translate(body)
    with pytest.raises(errors.Unsupported) as caught:
        registry.backend(kind).check(t.request)
    r = t.render_error(caught.value)
    assert r.status == 424 and f"`{named}`" in orjson.loads(r.body)["error"]


@pytest.mark.parametrize(("params", "temperature"), [
    ({}, 0.0),  # greedy by default
    ({"do_sample": False, "temperature": 0.9}, 0.0),  # do_sample false forces greedy
    ({"do_sample": True}, None),  # the worker's sampling defaults
    ({"do_sample": True, "temperature": 0.7}, 0.7),
    ({"temperature": 0.7}, 0.7),  # 0.32: inferred from the sampling parameters
    ({"top_p": 0.9}, None),
    ({"top_k": 40}, None),
    ({"top_k": -1}, 0.0),  # -1 / 0 turn top_k off: still greedy
    ({"top_p": 1.0}, 0.0),
])
def test_greedy_unless_sampling_is_asked_for(params: dict[str, Any],
                                             temperature: float | None) -> None:
    assert upstream(inputs(**params)).get("temperature") == temperature


def test_details_request_token_ids_and_logprobs() -> None:
    sent = upstream(inputs(details=True))
    assert sent["return_token_ids"] is True and sent["logprobs"] == 0
    sent = upstream({**inputs(), "stream": True})  # every streamed line has id and log_prob
    assert sent["return_token_ids"] is True and sent["logprobs"] == 0 and sent["stream"]


def test_tgi_compat_turns_details_on_by_default() -> None:
    t = translate(inputs(), ctx(tgi_compat=True))
    assert t.request.per_token and t.state.details and t.state.tgi_compat
    t = translate(inputs(details=False), ctx(tgi_compat=True))
    assert not t.request.token_ids and not t.state.details


@pytest.mark.parametrize(("opts", "stream_sse"), [
    ({}, False), ({"output_formatter": "sse"}, True), ({"tgi_compat": True}, True)])
def test_framing_follows_output_formatter_and_tgi_compat(opts: dict[str, Any],
                                                          stream_sse: bool) -> None:
    t = translate({**inputs(), "stream": True}, ctx(**opts))
    enc = t.encoder(base.ResponseMeta("x", 1, "m"))
    assert enc.media_type == ("text/event-stream" if stream_sse else "application/jsonlines")


def test_chat_ignores_tgi_compat_but_follows_output_formatter() -> None:
    """input_parser.py: chat requests get jsonlines_chat; only SSE via output_formatter."""
    chat = {"messages": [{"role": "user", "content": "Hi"}], "stream": True}
    meta = base.ResponseMeta("x", 1, "m")
    for opts, media in (({"tgi_compat": True}, "application/jsonlines"),
                        ({"output_formatter": "sse"}, "text/event-stream")):
        assert translate(chat, ctx(**opts)).encoder(meta).media_type == media


@pytest.mark.parametrize(("body", "schema"), [
    ({"messages": [{"role": "user", "content": "Hi"}]}, "chat"),
    ({"prompt": "Hi"}, "completion"),
    ({"prompt": ["a", "b"]}, "completion"),
    ({"inputs": "Hi"}, "rolling"),
    ({"inputs": ["a", "b"]}, "dynamic"),
    ({"messages": [{"role": "user", "content": "Hi"}], "inputs": "x"}, "chat"),  # messages first
])
def test_the_body_picks_the_schema(body: dict[str, Any], schema: str) -> None:
    t = translate(body)
    assert t.state.schema == schema
    assert (t.request.messages is not None) == (schema == "chat")


def test_invocations_serves_the_default_model_whatever_the_body_names() -> None:
    req = parse({"messages": [{"role": "user", "content": "Hi"}], "model": "gpt2"})
    assert req.model is None
    assert parse({"inputs": "Hi", "model": "anything"}).model is None


def test_predictions_names_the_model_and_reads_its_options() -> None:
    c = ctx("/predictions/llama", tgi_compat=True)
    t = translate(inputs(), c)
    assert t.request.model == "llama" and t.state.tgi_compat


def test_list_prompts_and_dynamic_batch() -> None:
    sent = upstream({"inputs": ["a", "b"], "parameters": {"details": True}})
    assert sent["prompt"] == ["a", "b"] and "return_token_ids" not in sent  # no details there
    assert upstream({"prompt": ["a", "b"], "max_tokens": 3})["prompt"] == ["a", "b"]


def test_return_full_text_is_prepended_here_not_echoed_upstream() -> None:
    t = translate(inputs(return_full_text=True))
    assert not t.request.echo and t.state.prefix(0) == "What is Deep Learning?"


@pytest.mark.parametrize(("body", "field"), [
    ({"inputs": ""}, "inputs"),
    ({"inputs": []}, "inputs"),
    ({"inputs": 5}, "inputs"),
    ({"inputs": "x", "parameters": {"max_new_tokens": 0}}, "parameters.max_new_tokens"),
    ({"inputs": "x", "parameters": {"temperature": -1}}, "parameters.temperature"),
    ({"inputs": "x", "parameters": {"top_p": 0}}, "parameters.top_p"),
    ({"inputs": "x", "parameters": {"foo": 1}}, "parameters.foo"),
    ({"inputs": "x", "parameters": {"stop": True}}, "parameters.stop"),
    ({"inputs": "x", "parameters": {"seed": "abc"}}, "parameters.seed"),
    ({"inputs": "x", "parameters": []}, "parameters"),
    ({"inputs": "x", "adapters": [7]}, "adapters"),  # a LoRA is named by its name
    ({"inputs": "x", "stream": True, "parameters": {"n": 2}}, "parameters.n"),
    ({"inputs": "x", "stream": True, "parameters": {"decoder_input_details": True}},
     "parameters.decoder_input_details"),
    ({"text": "x"}, "inputs"),
    ({"messages": []}, "messages"),
])
def test_invalid_requests_are_424_naming_the_field(body: dict[str, Any], field: str) -> None:
    fe = lmi.LmiFrontend()
    with pytest.raises(errors.InvalidRequest) as caught:
        fe.parse(orjson.dumps(body), ctx())
    assert caught.value.field is not None and caught.value.field.startswith(field)
    r = fe.render_error(caught.value)
    assert r.status == 424


def test_a_worker_without_token_ids_still_serves_details_and_streams() -> None:
    """The generic OpenAI and trtllm-serve workers give no token ids: details and streams
    still go through (ids come from the tokenizer, else -1: SPEC.md); prefill, which the
    client asks for by name, is refused before any I/O with a 424 naming it."""
    for backend in (openai_backend.OpenAIBackend(), trtllm.TrtllmBackend()):
        assert upstream(inputs(max_new_tokens=3), backend)["max_tokens"] == 3
        for body in (inputs(details=True), {**inputs(), "stream": True}):
            req = parse(body)
            assert req.per_token and not req.token_ids
            backend.check(req)
        t = translate(inputs(details=True, decoder_input_details=True))
        with pytest.raises(errors.Unsupported) as caught:
            backend.check(t.request)
        assert caught.value.field == "prompt_logprobs"
        assert t.render_error(caught.value).status == 424
    # trtllm-serve takes `logprobs`, so the lines carry its log probs (1: it reads 0 as none,
    # openai_protocol.py CompletionRequest.to_sampling_params); a plain OpenAI server may not
    # take it, so it is not asked
    assert upstream(inputs(details=True), trtllm.TrtllmBackend())["logprobs"] == 1
    assert "logprobs" not in upstream(inputs(details=True), openai_backend.OpenAIBackend())


def test_greedy_helper_matches_seed_note() -> None:
    assert lmi_params.greedy(wire.GenerationParameters())
    assert not lmi_params.greedy(wire.GenerationParameters(do_sample=True))


def test_a_seed_past_a_long_names_the_field_not_the_union_member() -> None:
    """`seed` is an int or a numeric text (DJL: `int(seed)`); an int past 2^63-1 was reported
    as `parameters.seed.constrained-int`, pydantic's name for the bounded member."""
    with pytest.raises(errors.InvalidRequest) as info:
        parse(inputs(seed=2**64 - 1))
    assert info.value.field == "parameters.seed"
    assert info.value.message.startswith("`parameters.seed`: Input should be less than or equal")
