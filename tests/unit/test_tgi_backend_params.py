"""The tgi worker protocol's request side. Its tables cover every canonical field; what TGI's
validation.rs would refuse but can say another way is translated (temperature 0 is
`do_sample: false`, top_p 1.0 is no `top_p`), the rest refused with a 400 naming the field.
Requests are checked against TGI's own request models (schemas/tgi.py, lib.rs)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from adapters import base
from adapters.backends import params, stops, tgi
from adapters.frontends import openai as openai_frontend
from adapters.frontends import tgi as tgi_frontend
from adapters.frontends import tgi_encode
from schemas import canonical, errors
from schemas import events as ev
from schemas import tgi as wire

TARGET = base.Target("http://tgi:8080/", "org/model", {"name": "llama"})
BACKEND = tgi.TgiBackend()


def chat(**fields: Any) -> canonical.InferenceRequest:
    body = {"model": "llama", "messages": [{"role": "user", "content": "Hi"}], **fields}
    return openai_frontend.OpenAIChatFrontend().parse(orjson.dumps(body),
                                                      base.RequestContext()).request


def completion(**fields: Any) -> canonical.InferenceRequest:
    body = {"model": "llama", "prompt": "Say", **fields}
    return openai_frontend.OpenAICompletionsFrontend().parse(orjson.dumps(body),
                                                             base.RequestContext()).request


def built(req: canonical.InferenceRequest) -> tuple[base.UpstreamRequest, dict[str, Any]]:
    BACKEND.check(req)
    up = BACKEND.build(req, TARGET)
    return up, orjson.loads(up.body)


def parameters(req: canonical.InferenceRequest) -> dict[str, Any]:
    up, body = built(req)
    wire.GenerateRequest.model_validate(body)
    p: dict[str, Any] = body["parameters"]
    assert p.pop("details") is True  # always: finish reason, counts, input_length
    return p


@pytest.mark.parametrize("table", [tgi.GENERATE, tgi.CHAT], ids=["generate", "chat"])
def test_each_table_has_a_rule_for_every_canonical_field(table: params.Table) -> None:
    assert params.covers(table) == []


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, {"do_sample": True}),
    ({"temperature": 0}, {"do_sample": False}),
    ({"temperature": 0.5}, {"do_sample": True, "temperature": 0.5}),
    ({"top_p": 1.0}, {"do_sample": True}),
    ({"top_p": 0.9}, {"do_sample": True, "top_p": 0.9}),
    ({"top_k": -1}, {"do_sample": True}),
    ({"top_k": 40}, {"do_sample": True, "top_k": 40}),
    ({"max_tokens": 12, "seed": 1, "stop": "."},
     {"do_sample": True, "max_new_tokens": 12, "seed": 1, "stop": ["."]}),
    ({"logprobs": 3}, {"do_sample": True, "top_n_tokens": 3}),
    ({"repetition_penalty": 1.2, "frequency_penalty": 0.5, "truncate_prompt_tokens": 100},
     {"do_sample": True, "repetition_penalty": 1.2, "frequency_penalty": 0.5,
      "truncate": 100}),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"properties": {"a": {"type": "string"}}}}}},
     {"do_sample": True, "grammar": {"type": "json_schema", "value": {
         "schema": {"properties": {"a": {"type": "string"}}}, "name": "x"}}}),
])
def test_generate_parameters_translate_what_tgi_would_refuse(fields: dict[str, Any],
                                                             expected: dict[str, Any]) -> None:
    """A completions request that names no limit gets OpenAI's default of 16, not TGI's own
    (validation.rs: max_total_tokens less the prompt)."""
    assert parameters(completion(**fields)) == {"max_new_tokens": 16, **expected}


@pytest.mark.parametrize("warpers", [{"top_k": 40}, {"top_p": 0.9}, {"top_k": 40, "top_p": 0.9}])
def test_temperature_zero_is_greedy_whatever_the_warpers_say(warpers: dict[str, Any]) -> None:
    """TGI samples again when top_k / top_p / typical_p is set, even with do_sample false
    (server/text_generation_server/utils/tokens.py NextTokenChooser: `sampling = do_sample or
    has_warpers`); at temperature 0 an OpenAI client means greedy, as vLLM decodes it."""
    assert parameters(completion(temperature=0, max_tokens=2, **warpers)) == {
        "do_sample": False, "max_new_tokens": 2}


def test_prompts_stream_from_generate_stream_even_without_client_streaming() -> None:
    """/generate's body has no input_length; the stream's last event does (StreamDetails)."""
    up, _ = built(completion())
    assert up.url == "http://tgi:8080/generate_stream" and up.streaming


def test_prompt_logprobs_and_best_of_need_generate() -> None:
    up, body = built(completion(prompt_logprobs=1))
    assert up.url.endswith("/generate") and not up.streaming
    assert body["parameters"]["decoder_input_details"] is True
    up, body = built(completion(n=2, temperature=0.8))
    assert up.url.endswith("/generate") and body["parameters"]["best_of"] == 2


@pytest.mark.parametrize(("fields", "field", "kind"), [
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", errors.InvalidRequest),
    ({"max_tokens": 0}, "max_tokens", errors.InvalidRequest),
    ({"top_p": 0}, "top_p", errors.InvalidRequest),
    ({"n": 2, "stream": True}, "n", errors.Unsupported),
    ({"n": 3, "temperature": 1.0}, "n", errors.InvalidRequest),
    ({"n": 2, "seed": 4}, "seed", errors.InvalidRequest),
    ({"n": 2, "temperature": 0}, "n", errors.InvalidRequest),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", errors.Unsupported),
    ({"min_p": 0.1}, "min_p", errors.Unsupported),
    ({"stop_token_ids": [2]}, "stop_token_ids", errors.Unsupported),
    ({"presence_penalty": 0.5}, "presence_penalty", errors.Unsupported),
    ({"logit_bias": {"1": 2.0}}, "logit_bias", errors.Unsupported),
    ({"suffix": "x"}, "suffix", errors.Unsupported),
    ({"response_format": {"type": "json_object"}}, "response_format", errors.Unsupported),
    ({"prompt": ["a", "b"]}, "prompt", errors.Unsupported),
    ({"echo": True, "logprobs": 1}, "echo", errors.Unsupported),
])
def test_generate_refusals_name_the_field(fields: dict[str, Any], field: str,
                                          kind: type[errors.GatewayError]) -> None:
    with pytest.raises(kind) as exc:
        BACKEND.check(completion(**fields))
    assert exc.value.field == field and exc.value.status == 400
    assert f"`{field}`" in exc.value.message


def test_chat_goes_to_tgis_messages_api_as_model_tgi() -> None:
    """lib.rs try_into_generate: any model name but "tgi" is taken as a LoRA adapter id."""
    up, body = built(chat(stream=True, temperature=0, top_p=1.0, repetition_penalty=1.3,
                          logprobs=True, top_logprobs=2, stop="."))
    assert up.url == "http://tgi:8080/v1/chat/completions" and up.streaming
    assert body == {"model": "tgi", "messages": [{"role": "user", "content": "Hi"}],
                    "temperature": 0, "presence_penalty": -0.7, "stop": ["."], "logprobs": True,
                    "top_logprobs": 2, "stream": True, "stream_options": {"include_usage": True}}


def test_an_additive_presence_penalty_is_refused_by_tgis_chat() -> None:
    """lib.rs try_into_generate reads `presence_penalty` as `repetition_penalty = p + 2.0`:
    OpenAI's presence_penalty 0.5 (additive, as vLLM applies it) would reach TGI as a
    repetition penalty of 2.5. A clear 400 instead (SPEC: never a silently other answer);
    0, OpenAI's "no penalty", is taken and left out."""
    with pytest.raises(errors.Unsupported) as exc:
        BACKEND.check(chat(presence_penalty=0.5))
    assert exc.value.field == "presence_penalty"
    _, body = built(chat(presence_penalty=0))
    assert "presence_penalty" not in body and "repetition_penalty" not in body


@pytest.mark.parametrize("fields", [{"temperature": 0}, {"temperature": 0.0}])
def test_chat_at_temperature_zero_is_greedy_whatever_top_p_says(fields: dict[str, Any]) -> None:
    """TGI's chat maps temperature 0 to `do_sample: false` (lib.rs try_into_generate) but
    passes `top_p` on, and a `top_p` below 1 makes it sample again (server/text_generation_server/
    utils/tokens.py NextTokenChooser: `sampling = do_sample or has_warpers`): greedy, as an
    OpenAI client means temperature 0, is asked without it, as on /generate."""
    _, body = built(chat(top_p=0.9, max_tokens=3, **fields))
    assert "top_p" not in body and body["temperature"] == 0


def test_chat_tools_and_messages_in_tgis_shapes() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "ok", "tool_call_id": "c"}]
    _, body = built(chat(messages=msgs, tools=tools,
                         tool_choice={"type": "function", "function": {"name": "f"}}))
    # Message (lib.rs): an untagged body, `content` or `tool_calls`, never a null content
    assert body["messages"][1] == {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert body["messages"][2]["content"] == "ok"
    assert body["tools"][0]["function"]["name"] == "f"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(("fields", "field"), [
    ({"top_k": 5}, "top_k"), ({"n": 2}, "n"), ({"return_token_ids": True}, "token_ids"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"), ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"min_tokens": 3}, "min_tokens"),
])
def test_chat_refusals_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.Unsupported) as exc:
        BACKEND.check(chat(**fields))
    assert exc.value.field == field


def test_chat_with_tools_and_a_response_format_is_the_clients_400() -> None:
    """TGI's chat route refuses both at once (router lib.rs try_into_generate: "Grammar and
    tools are mutually exclusive", a 422 ToolError), its tools being a grammar of their own:
    the client's 400 names `response_format` before any request; each alone goes."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}
    with pytest.raises(errors.Unsupported) as exc:
        BACKEND.check(chat(tools=tools, response_format=fmt))
    assert exc.value.field == "response_format" and exc.value.status == 400
    assert "`response_format`" in exc.value.message
    assert "response_format" in built(chat(response_format=fmt))[1]
    assert "tools" in built(chat(tools=tools))[1]


@pytest.mark.parametrize("req", [
    chat(logprobs=True, top_logprobs=6), chat(logprobs=True, top_logprobs=20, stream=True),
    completion(logprobs=6)], ids=["chat", "chat-stream", "completion"])
def test_more_alternatives_than_tgi_gives_are_the_clients_400(
        req: canonical.InferenceRequest) -> None:
    """TGI refuses `top_n_tokens` above `--max-top-n-tokens` (launcher main.rs default 5;
    router validation.rs `TopNTokens`: "`top_n_tokens` must be >= 0 and <= 5"), which both its
    /generate and its chat route (`top_logprobs` as `top_n_tokens`, lib.rs try_into_generate)
    check: the client's 400 names its field before any request, not the worker's 422 naming
    a TGI field the client never sent; 5 and fewer go as asked."""
    with pytest.raises(errors.InvalidRequest) as exc:
        BACKEND.check(req)
    assert exc.value.field == "top_logprobs" and exc.value.status == 400
    assert "`top_logprobs` must be <= 5" in exc.value.message
    assert built(chat(logprobs=True, top_logprobs=5))[1]["top_logprobs"] == 5
    assert parameters(completion(logprobs=5))["top_n_tokens"] == 5


def test_tgi_clients_keep_their_stop_sequence_and_regex_grammar() -> None:
    req = tgi_frontend.TgiFrontend("stream").parse(orjson.dumps({"inputs": "Hi", "parameters": {
        "stop": ["."], "grammar": {"type": "regex", "value": "[0-9]+"}, "details": True}}),
        base.RequestContext()).request
    assert stops.kept(req)
    assert parameters(req) == {"do_sample": False, "stop": ["."],
                               "grammar": {"type": "regex", "value": "[0-9]+"}}


def test_the_tgi_front_end_puts_back_a_stop_string_a_worker_dropped() -> None:
    """tgi_encode.with_stop: TGI's own clients get TGI's text (stop sequence included) even
    when the worker (vLLM, or a stripping decoder) left it out."""
    finish = ev.Finish(0, "stop_string", ".")
    assert tgi_encode.with_stop(" The answer is 42", finish) == " The answer is 42."
    assert tgi_encode.with_stop(" The answer is 42.", finish) == " The answer is 42."


def test_health_is_tgis_health_route() -> None:
    assert BACKEND.health_path() == "/health"


@pytest.mark.parametrize("seed", [-1, -(2**63), 0, 2**63 - 1])
def test_a_negative_seed_is_sent_as_the_u64_of_the_same_bits(seed: int) -> None:
    """TGI's seed is a u64 (huggingface/text-generation-inference router/src/lib.rs:
    `GenerateParameters.seed: Option<u64>`, `ChatRequest.seed: Option<u64>`), so serde refuses
    -1 with a 422; vLLM takes any 64-bit seed (protocol.py `seed: Field(ge=_LONG_INFO.min)`).
    The same seed always maps to the same u64, so a client's seeded answers stay repeatable."""
    p = parameters(completion(seed=seed))
    assert p["seed"] == seed % 2**64
    wire.GenerateParameters.model_validate(p)
    _, body = built(chat(seed=seed))
    assert body["seed"] == seed % 2**64
