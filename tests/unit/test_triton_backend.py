"""The triton worker protocol's request side: its parameter table covers every canonical field,
values TensorRT-LLM says another way are translated, the rest refused with a 400 naming them,
and chat needs the model's chat template. Sources: ensemble/config.pbtxt (inputs), Triton
docs/protocol/extension_generate.md and src/http_server.cc (URLs, error statuses)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from adapters import base
from adapters.backends import params, triton
from adapters.frontends import openai as openai_frontend
from adapters.frontends import tgi as tgi_frontend
from schemas import canonical, errors
from schemas import triton as wire

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
TARGET = base.Target("http://w:8000/", "ensemble", {"name": "llama", "chat_template": TEMPLATE})
BACKEND = triton.TritonBackend()
# What a request that leaves sampling to its protocol's default is sent (below)
SAMPLES = {"top_p": 1.0}


def chat(**fields: Any) -> canonical.InferenceRequest:
    body = {"model": "llama", "messages": [{"role": "user", "content": "Hi"}], **fields}
    return openai_frontend.OpenAIChatFrontend().parse(orjson.dumps(body),
                                                      base.RequestContext()).request


def completion(**fields: Any) -> canonical.InferenceRequest:
    body = {"model": "llama", "prompt": "Say", **fields}
    return openai_frontend.OpenAICompletionsFrontend().parse(orjson.dumps(body),
                                                             base.RequestContext()).request


def sent(req: canonical.InferenceRequest, target: base.Target = TARGET) -> dict[str, Any]:
    BACKEND.check(req)
    up = BACKEND.build(req, target)
    body: dict[str, Any] = orjson.loads(up.body)
    wire.GenerateRequest.model_validate(body)  # only inputs the ensemble declares
    return body


def test_the_table_has_a_rule_for_every_canonical_field() -> None:
    assert params.covers(triton.TRITON) == []


def test_chat_is_rendered_with_the_template_and_sent_to_generate_stream() -> None:
    req = chat(stream=True)
    up = BACKEND.build(req, TARGET)
    assert up.url == "http://w:8000/v2/models/ensemble/generate_stream" and up.streaming
    body = orjson.loads(up.body)
    assert body["text_input"] == "[user] Hi\n[assistant]"
    assert body["stream"] is True and body["exclude_input_in_output"] is True
    assert body["return_num_input_tokens"] is body["return_num_output_tokens"] is True


def test_model_names_are_quoted_into_the_path() -> None:
    up = BACKEND.build(completion(), base.Target("http://w", "my model/v2", {}))
    assert up.url == "http://w/v2/models/my%20model%2Fv2/generate"


@pytest.mark.parametrize(("req", "limit"), [
    (completion(), triton.DEFAULT_MAX_TOKENS),
    (chat(), triton.UNLIMITED_MAX_TOKENS),
    (completion(max_tokens=7), 7),
    (chat(max_completion_tokens=9), 9),
])
def test_max_tokens_is_always_sent(req: canonical.InferenceRequest, limit: int) -> None:
    assert sent(req)["max_tokens"] == limit


def test_tgi_clients_as_many_as_fit_gets_the_unlimited_default() -> None:
    req = tgi_frontend.TgiFrontend("generate").parse(b'{"inputs": "Hi", "parameters": {}}',
                                                     base.RequestContext()).request
    assert req.sampling.max_tokens_fit and req.sampling.max_tokens is None
    assert sent(req)["max_tokens"] == triton.UNLIMITED_MAX_TOKENS


@pytest.mark.parametrize(("fields", "expected"), [
    ({"temperature": 0}, {"top_k": 1}),
    # greedy whatever top_k / top_p say (the ensemble maps them to runtime_top_k / _top_p,
    # which would sample), as vLLM decodes at temperature 0
    ({"temperature": 0, "top_k": 40, "top_p": 0.9}, {"top_k": 1}),
    ({"temperature": 0.7}, {"temperature": 0.7, **SAMPLES}),
    ({"top_k": -1}, SAMPLES),
    ({"top_k": 5, "top_p": 0.9, "seed": 3}, {"top_k": 5, "top_p": 0.9, "seed": 3}),
    ({"stop": "\n"}, {"stop_words": ["\n"], **SAMPLES}),
    # `seed` is TYPE_UINT64 (ensemble/config.pbtxt), which Triton reads with AsUInt
    # (server src/http_server.cc ReadDataFromJsonHelper): a client's negative 64-bit seed
    # (OpenAI's and vLLM's range) goes as its u64 bits, as to TGI (`seed: Option<u64>`)
    ({"seed": -1}, {"seed": 2**64 - 1, **SAMPLES}),
    ({"min_tokens": 2, "repetition_penalty": 1.1},
     {"min_tokens": 2, "repetition_penalty": 1.1, **SAMPLES}),
    ({"presence_penalty": 0.5, "frequency_penalty": 0.2},
     {"presence_penalty": 0.5, "frequency_penalty": 0.2, **SAMPLES}),
    ({"response_format": {"type": "json_object"}},
     {"guided_decoding_guide_type": "json", **SAMPLES}),
    ({"bad_words": ["darn"], "end_id": 2}, {"bad_words": ["darn"], "end_id": 2, **SAMPLES}),
])
def test_sampling_is_mapped_onto_the_ensemble_inputs(fields: dict[str, Any],
                                                     expected: dict[str, Any]) -> None:
    body = sent(completion(**fields))
    extra = {k: v for k, v in body.items() if k not in wire.GATEWAY_INPUTS}
    assert extra == expected


@pytest.mark.parametrize("req", [
    completion(), chat(), completion(temperature=1.3), chat(stream=True),
    tgi_frontend.TgiFrontend("generate").parse(
        b'{"inputs": "Hi", "parameters": {"do_sample": true}}', base.RequestContext()).request,
])
def test_a_request_that_samples_by_default_is_sent_top_p_1(req: canonical.InferenceRequest
                                                           ) -> None:
    """OpenAI samples unless told otherwise (temperature 1, top_p 1); TensorRT-LLM decodes
    greedily when neither runtime_top_k nor runtime_top_p is set (tensorrt_llm
    sampling_params.py `_greedy_decoding`: top_k None or 1 and top_p None or 0, whatever the
    temperature), so such a request was answered greedily. Triton's own OpenAI front end sends
    its schema's `top_p` 1 (server python/openai/openai_frontend/schemas/openai.py,
    engine/utils/triton.py `_create_trtllm_inference_request`); so does the gateway."""
    body = sent(req)
    assert body["top_p"] == 1.0 and "top_k" not in body


@pytest.mark.parametrize(("req", "bounds"), [
    (completion(temperature=0), {"top_k": 1}),
    (completion(top_p=0.5), {"top_p": 0.5}),
    (completion(top_k=3), {"top_k": 3}),
    (tgi_frontend.TgiFrontend("generate").parse(b'{"inputs": "Hi", "parameters": {}}',
                                                base.RequestContext()).request, {"top_k": 1}),
])
def test_greedy_or_the_clients_own_bounds_are_sent_as_they_are(
        req: canonical.InferenceRequest, bounds: dict[str, Any]) -> None:
    body = sent(req)
    assert {k: body[k] for k in ("top_k", "top_p") if k in body} == bounds


@pytest.mark.parametrize(("fields", "field"), [
    ({"n": 2}, "n"),
    ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ({"return_token_ids": True}, "token_ids"),
    ({"min_p": 0.1}, "min_p"),
    ({"stop_token_ids": [2]}, "stop_token_ids"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"ignore_eos": True}, "ignore_eos"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     "tool_choice"),
])
def test_what_the_ensemble_cannot_do_is_refused_naming_the_field(fields: dict[str, Any],
                                                                 field: str) -> None:
    with pytest.raises(errors.Unsupported) as exc:
        BACKEND.check(chat(**fields))
    assert exc.value.field == field and exc.value.status == 400
    assert f"`{field}`" in exc.value.message


@pytest.mark.parametrize(("prompt", "field"), [(["a", "b"], "prompt"), ([1, 2, 3], "prompt")])
def test_one_text_prompt_per_request(prompt: Any, field: str) -> None:
    with pytest.raises(errors.Unsupported) as exc:
        BACKEND.check(completion(prompt=prompt))
    assert exc.value.field == field


def test_echo_with_logprobs_is_refused_but_echo_alone_is_the_decoders() -> None:
    assert "echo" not in sent(completion(echo=True))
    with pytest.raises(errors.Unsupported):
        BACKEND.check(completion(echo=True, logprobs=1))


def test_noop_values_pass_silently() -> None:
    assert "ignore_eos" not in sent(completion(ignore_eos=False, skip_special_tokens=True))


def test_dropped_fields_are_said_in_a_log_line() -> None:
    with capture_logs() as logs:
        body = sent(chat(user="alice", some_vendor_field=1))
    assert "user" not in body and "some_vendor_field" not in body
    dropped = {e["field"] for e in logs if e["event"] == "parameter_dropped"}
    assert dropped == {"user", "some_vendor_field"}
    assert all(e["worker"] == "triton" for e in logs)


def test_chat_without_a_template_is_a_400_naming_chat_template() -> None:
    req = chat()
    BACKEND.check(req)  # nothing else is wrong with it
    with pytest.raises(errors.InvalidRequest) as exc:
        BACKEND.build(req, base.Target("http://w", "ensemble", {"name": "llama"}))
    assert exc.value.field == "chat_template" and exc.value.status == 400
    assert "models[].chat_template" in exc.value.message and "`llama`" in exc.value.message


def test_tools_are_rendered_by_the_template_unless_tool_choice_is_none() -> None:
    tmpl = "{% for t in tools or [] %}<tool>{{ t.function.name }}</tool>{% endfor %}" + TEMPLATE
    target = base.Target("http://w", "ensemble", {"chat_template": tmpl})
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    assert sent(chat(tools=tools), target)["text_input"].startswith("<tool>get_weather</tool>")
    assert "<tool>" not in sent(chat(tools=tools, tool_choice="none"), target)["text_input"]


@pytest.mark.parametrize(("status", "body", "kind", "out"), [
    (400, b'{"error":"in ensemble \'ensemble\', bad input"}', errors.UpstreamRejected, 400),
    (404, b'{"error":"Request for unknown model: \'x\' is not found"}',
     errors.UpstreamUnavailable, 503),
    (500, b'{"error":"internal"}', errors.UpstreamUnavailable, 502),
    (503, b'{"error":"busy"}', errors.UpstreamUnavailable, 503),
    # a rate limit in front of the worker: another upstream is asked (the client gets the 429
    # only where none takes it)
    (429, b'{"error":"too many requests"}', errors.UpstreamUnavailable, 429),
    (400, b'data: {"error":"first response failed"}\n\n', errors.UpstreamRejected, 400),
])
def test_worker_statuses_map_to_the_error_tree(status: int, body: bytes,
                                               kind: type[errors.GatewayError], out: int) -> None:
    exc = BACKEND.parse_error(status, body)
    assert type(exc) is kind and exc.status == out
    assert orjson.loads(body.removeprefix(b"data: "))["error"] == exc.message


def test_health_is_tritons_readiness_route() -> None:
    assert BACKEND.health_path() == "/v2/health/ready"
