"""The OpenAI-style worker protocols' request side (openai, vllm, trtllm) in the `Rule` idiom of
params.py: a rule for every canonical field, the table's order for checks and body keys, the
extras each worker declares (`ACCEPTED_EXTRAS`), and the refusals worded as before the tables.
Sources: vLLM protocol.py (extra="allow"), trtllm-serve openai_protocol.py (extra="forbid"),
wire-formats.md sections 3.1, 6.1 and 8."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import structlog.testing

from adapters import base, registry
from adapters.backends import openai, params, tgi, triton, trtllm, vllm
from adapters.frontends import openai as openai_frontend
from adapters.frontends import tgi as tgi_frontend
from schemas import canonical, errors

TARGET = base.Target("http://worker:8000/", "org/m")
KINDS = ("openai", "vllm", "trtllm")


def chat(**fields: Any) -> canonical.InferenceRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    return openai_frontend.OpenAIChatFrontend().parse(orjson.dumps(body),
                                                      base.RequestContext()).request


def completion(**fields: Any) -> canonical.InferenceRequest:
    body = {"model": "m", "prompt": "Say", **fields}
    return openai_frontend.OpenAICompletionsFrontend().parse(orjson.dumps(body),
                                                             base.RequestContext()).request


def body_of(kind: str, req: canonical.InferenceRequest) -> dict[str, Any]:
    backend = registry.backend(kind)
    backend.check(req)
    out: dict[str, Any] = orjson.loads(backend.build(req, TARGET).body)
    return out


def refusal(kind: str, req: canonical.InferenceRequest) -> str:
    with pytest.raises(errors.Unsupported) as info:
        registry.backend(kind).check(req)
    return info.value.message


@pytest.mark.parametrize("kind", KINDS)
def test_each_table_has_a_rule_for_every_canonical_field(kind: str) -> None:
    backend = registry.BACKENDS[kind]
    assert isinstance(backend, type) and issubclass(backend, openai.OpenAIBackend)
    assert params.covers(backend.TABLE) == []


def test_every_backend_says_which_extras_it_takes() -> None:
    """The allow-lists: what a worker kind declares beyond the canonical fields."""
    assert {"chat_template_kwargs", "structured_outputs", "max_tokens"} <= \
        vllm.VllmBackend.ACCEPTED_EXTRAS
    assert "structured_outputs" in trtllm.TrtllmBackend.ACCEPTED_EXTRAS  # as response_format
    assert "structured_outputs" not in openai.OpenAIBackend.ACCEPTED_EXTRAS  # refused there
    assert "lora_request" in trtllm.TrtllmBackend.ACCEPTED_EXTRAS
    assert "suffix" in openai.OpenAIBackend.ACCEPTED_EXTRAS
    assert "suffix" not in trtllm.TrtllmBackend.ACCEPTED_EXTRAS  # check_suffix
    assert triton.TritonBackend.ACCEPTED_EXTRAS >= triton.PASSTHROUGH
    assert tgi.TgiBackend.ACCEPTED_EXTRAS == {"adapter_id", "include_stop_str_in_output",
                                              "structured_outputs"}
    for kind in registry.BACKENDS:
        accepted = registry.BACKENDS[kind].ACCEPTED_EXTRAS  # type: ignore[attr-defined]
        assert isinstance(accepted, frozenset) and accepted


def test_the_body_follows_the_table_not_the_client() -> None:
    """Keys in the table's order (sampling, stream, options, extras), whatever order the
    client wrote them in, as the vLLM and trtllm goldens fix."""
    a = body_of("vllm", chat(priority=1, top_k=5, user="u", stop="!", max_tokens=3, stream=True))
    b = body_of("vllm", chat(max_tokens=3, stop="!", priority=1, stream=True, user="u", top_k=5))
    assert list(a) == list(b) == ["model", "messages", "max_tokens", "stop", "top_k", "stream",
                                  "stream_options", "user", "priority"]


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_and_options_as_each_worker_names_them(kind: str) -> None:
    body = body_of(kind, completion(temperature=0.5, seed=3, logprobs=2, echo=True,
                                    user="u"))
    assert body["temperature"] == 0.5 and body["seed"] == 3 and body["echo"] is True
    assert body["logprobs"] == 2  # completions: a count
    chat_body = body_of(kind, chat(logprobs=True, top_logprobs=2, tool_choice="none",
                                   tools=[{"type": "function", "function": {"name": "f"}}]))
    assert chat_body["logprobs"] is True and chat_body["top_logprobs"] == 2
    assert chat_body["tools"] == [{"type": "function", "function": {"name": "f"}}]
    assert chat_body["tool_choice"] == "none"


def test_vllm_names_its_own_fields() -> None:
    body = body_of("vllm", completion(truncate_prompt_tokens=9, return_token_ids=True,
                                      prompt_logprobs=1, min_p=0.1))
    assert body["truncate_prompt_tokens"] == 9 and body["return_token_ids"] is True
    assert body["prompt_logprobs"] == 1 and body["min_p"] == 0.1


@pytest.mark.parametrize(("kind", "fields", "message"), [
    ("openai", {"top_k": 5}, "`top_k` is not supported by this model's worker"),
    ("openai", {"return_token_ids": True, "prompt_logprobs": 1},
     "token ids are not available from this model's worker"),
    ("trtllm", {"prompt_logprobs": 1}, "`prompt_logprobs` is not supported by this model's "
     "worker"),
    ("trtllm", {"structured_outputs": {"choice": ["a", "b"]}},
     "`structured_outputs` is not supported by this model's worker (trtllm-serve): only "
     "`regex`, `json`, `json_object` and `grammar` have a `response_format`"),
    ("trtllm", {"guided_regex": "a"},
     "`guided_regex` is not supported by this model's worker (trtllm-serve)"),
    ("openai", {"structured_outputs": {"regex": "a"}},
     "`structured_outputs` is not supported by this model's worker"),
    ("trtllm", {"suffix": "s"}, "`suffix` is not supported by this model's worker "
     "(trtllm-serve)"),
    ("vllm", {"typical_p": 0.5}, "`typical_p` is not supported by this model's worker"),
])
def test_refusals_keep_their_words(kind: str, fields: dict[str, Any], message: str) -> None:
    assert refusal(kind, completion(**fields)) == message


@pytest.mark.parametrize(("outputs", "response_format"), [
    ({"regex": "[0-9]+"}, {"type": "regex", "regex": "[0-9]+"}),
    ({"json": {"type": "object", "properties": {"a": {"type": "string"}}}},
     {"type": "json", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}),
    ({"json": '{"type": "object"}'}, {"type": "json", "schema": {"type": "object"}}),
    ({"json_object": True}, {"type": "json_object"}),
    ({"grammar": "root ::= \"a\""}, {"type": "ebnf", "ebnf": "root ::= \"a\""}),
])
def test_structured_outputs_go_to_trtllm_as_its_response_format(
        outputs: dict[str, Any], response_format: dict[str, Any]) -> None:
    """vLLM's `structured_outputs` (which TGI's front end also makes of a regex `grammar`) is
    no trtllm-serve field, but each kind it names has a trtllm-serve `response_format`
    (openai_protocol.py ResponseFormat: `regex`, `json` with `schema`, `json_object`, `ebnf`,
    which `_response_format_to_guided_decoding_params` makes its guided decoding), so it is
    asked that way rather than refused; a plain OpenAI server has none of them, so there it
    is refused, never dropped (the answer would not follow it)."""
    assert body_of("trtllm", completion(structured_outputs=outputs))["response_format"] == \
        response_format
    assert body_of("trtllm", chat(structured_outputs=outputs))["response_format"] == \
        response_format
    assert "structured_outputs" not in body_of("trtllm", chat(structured_outputs=outputs))


def test_a_tgi_clients_regex_grammar_reaches_trtllm_and_is_refused_by_openai() -> None:
    req = tgi_frontend.TgiFrontend("generate").parse(orjson.dumps({
        "inputs": "Hi", "parameters": {"grammar": {"type": "regex", "value": "[0-9]+"}}}),
        base.RequestContext()).request
    assert body_of("trtllm", req)["response_format"] == {"type": "regex", "regex": "[0-9]+"}
    with pytest.raises(errors.Unsupported) as info:
        registry.backend("openai").check(req)
    assert info.value.field == "structured_outputs"


def test_trtllm_refuses_an_undeclared_extra_even_when_null() -> None:
    """trtllm-serve's extra="forbid" refuses the key, whatever its value; vLLM and OpenAI
    servers never see an undeclared one."""
    req = completion(api_key=None)
    assert refusal("trtllm", req) == \
        "`api_key` is not supported by this model's worker (trtllm-serve)"
    assert "api_key" not in body_of("vllm", req)


def test_as_many_tokens_as_fit_and_kept_stops_in_each_workers_terms() -> None:
    """The `Own` rules of `max_tokens_fit` and `keep_stop` (OpenAIBackend.limits)."""
    req = tgi_frontend.TgiFrontend("generate").parse(
        b'{"inputs":"Hi","parameters":{"stop":["."]}}', base.RequestContext()).request
    assert req.sampling.max_tokens_fit and req.sampling.keep_stop
    vllm_body = body_of("vllm", req)
    assert vllm_body["max_tokens"] is None and vllm_body["include_stop_str_in_output"] is True
    trtllm_body = body_of("trtllm", req)
    assert "max_tokens" not in trtllm_body and trtllm_body["include_stop_str_in_output"]
    assert "include_stop_str_in_output" not in body_of("openai", req)


@pytest.mark.parametrize("kind", ["openai", "vllm"])
def test_only_declared_extras_go_upstream_after_the_rest(kind: str) -> None:
    """No mass assignment (issue 12): an undeclared extra is dropped with a log line, even one
    named like a canonical field (completions have no `tools`); a declared one goes as the
    client wrote it, after the rest."""
    raw = [{"type": "function", "function": {"name": "f"}}]
    req = completion(tools=raw, api_key="sk", suffix="!", seed=1)
    with structlog.testing.capture_logs() as logs:
        body = body_of(kind, req)
    assert "tools" not in body and "api_key" not in body
    assert list(body)[-1] == "suffix" and body["suffix"] == "!"
    assert {(e["field"], e["worker"]) for e in logs} == {("tools", kind), ("api_key", kind)}
    assert "api_key" not in registry.BACKENDS[kind].ACCEPTED_EXTRAS  # type: ignore[attr-defined]


def test_a_client_extra_never_overrides_what_the_gateway_sets() -> None:
    body = body_of("vllm", completion(stream=True, include_stop_str_in_output=True,
                                      stream_options={"include_usage": False}))
    assert body["stream_options"] == {"include_usage": True}
    assert body["include_stop_str_in_output"] is True


def test_checking_logs_nothing_and_building_logs_drops_once() -> None:
    req = completion(user="u", skip_special_tokens=True)
    with structlog.testing.capture_logs() as logs:
        triton.TritonBackend().check(req)
    assert logs == []
    with structlog.testing.capture_logs() as logs:
        triton.TritonBackend().build(req, TARGET)
    assert [e["field"] for e in logs] == ["user"]  # skip_special_tokens=True is its noop


@pytest.mark.parametrize("kind", KINDS)
def test_build_after_check_walks_the_table_once_and_logs_each_drop_once(kind: str) -> None:
    """check() then build() of one request (the serving path) plan once: build() takes the
    plan check() kept for that request; build() of another request, or of one never checked
    (a continuation), plans for itself. Seen by what the kept plan says, not by replacing
    `params.plan`, which the compiled build (setup.py) calls directly."""
    backend = registry.backend(kind)
    undeclared = {} if kind == "trtllm" else {"unknown_field": 1}  # trtllm refuses it
    first, other = chat(max_tokens=5, **undeclared), chat(max_tokens=7)
    with structlog.testing.capture_logs() as logs:
        backend.check(first)
        kept = backend._checked  # noqa: SLF001 - the plan handed from check() to build()
        assert kept is not None and kept[0] is first
        assert orjson.loads(backend.build(first, TARGET).body)["max_tokens"] == 5
    assert [e["field"] for e in logs if e["event"] == "parameter_dropped"] == list(undeclared)
    # the kept plan is what build() follows for that request, without a walk of its own
    backend._checked = (first, [("max_tokens", False, {"max_tokens": 99})])  # noqa: SLF001
    assert orjson.loads(backend.build(first, TARGET).body)["max_tokens"] == 99
    assert orjson.loads(backend.build(other, TARGET).body)["max_tokens"] == 7
    never_checked = chat(max_tokens=3)
    assert orjson.loads(backend.build(never_checked, TARGET).body)["max_tokens"] == 3


def test_continuous_usage_is_asked_of_vllm_and_trtllm() -> None:
    """vLLM serving_chat.py / serving_completion.py and trtllm-serve postprocess_handlers.py
    (chat_stream_post_processor: `include_usage and stream_option.continuous_usage_stats`) put
    usage on every chunk with `stream_options.continuous_usage_stats`; both declare it in
    StreamOptions (vLLM protocol.py, trtllm-serve openai_protocol.py). OpenAI's StreamOptions
    has no such field, so a plain OpenAI server is asked for the final usage alone."""
    asked = chat(stream=True, stream_options={"include_usage": True,
                                               "continuous_usage_stats": True})
    assert asked.continuous_usage
    for kind in ("vllm", "trtllm"):
        assert body_of(kind, asked)["stream_options"] == {"include_usage": True,
                                                          "continuous_usage_stats": True}
    assert body_of("openai", asked)["stream_options"] == {"include_usage": True}
    off = chat(stream=True, stream_options={"include_usage": False,
                                             "continuous_usage_stats": True})
    assert not off.include_usage and not off.continuous_usage
    assert body_of("vllm", off)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("options", "usage", "continuous"), [
    ({}, True, False),
    ({"continuous_usage_stats": True}, True, True),
    ({"include_usage": None}, False, False),
    ({"include_usage": False}, False, False),
])
def test_stream_options_default_to_usage_as_the_workers_do(
        options: dict[str, Any], usage: bool, continuous: bool) -> None:
    """vLLM protocol.py and trtllm-serve openai_protocol.py: `StreamOptions.include_usage`
    defaults to true, so `stream_options: {}` (or only `continuous_usage_stats`) is a usage
    chunk there (vLLM should_include_usage, trtllm chat_stream_post_processor); an explicit
    null is falsy in both."""
    req = chat(stream=True, stream_options=options)
    assert (req.include_usage, req.continuous_usage) == (usage, continuous)


def test_empty_stream_options_without_stream_pass_as_in_vllm() -> None:
    """vLLM protocol.py validate_stream_options: `if data.get("stream_options") and not
    data.get("stream")`: an empty object is falsy and passes; a non-empty one is refused."""
    assert not chat(stream_options={}).include_usage
    with pytest.raises(errors.InvalidRequest) as info:
        chat(stream_options={"include_usage": True})
    assert info.value.field == "stream_options"


def test_max_tokens_zero_only_with_echo() -> None:
    """vLLM completion/protocol.py: `echo` with `max_tokens` 0 scores the prompt alone
    (echo_without_generation); 0 otherwise is refused (SamplingParams: at least 1)."""
    assert body_of("vllm", completion(max_tokens=0, echo=True, logprobs=1))["max_tokens"] == 0
    with pytest.raises(errors.InvalidRequest) as info:
        completion(max_tokens=0)
    assert info.value.field == "max_tokens"
    with pytest.raises(errors.InvalidRequest):
        chat(max_tokens=0)


@pytest.mark.parametrize(("fields", "param"), [
    ({"stop": 5}, "stop"),
    ({"tool_choice": {"type": "function"}}, "tool_choice"),
    ({"messages": [{"role": 5, "content": "x"}]}, "messages[0].role"),
])
def test_a_refused_field_is_named_as_the_body_names_it(fields: dict[str, Any],
                                                       param: str) -> None:
    """OpenAI's error `param` names the body's field (`stop`), not the union member pydantic
    tried (`stop.str`)."""
    with pytest.raises(errors.InvalidRequest) as info:
        chat(**fields)
    assert info.value.field == param
    assert info.value.message.startswith(f"`{param}`: ")


@pytest.mark.parametrize("kind", [*KINDS, "tgi"])
def test_any_role_reaches_the_worker_as_vllm_and_tgi_take_it(kind: str) -> None:
    """vLLM chat_utils.py `CustomChatCompletionMessageParam` (`role: Required[str]`) and TGI
    router lib.rs `Message { role: String }` take any role (Llama 3.1's `ipython` carries tool
    results); the worker's chat template decides what it means."""
    msgs = [{"role": "user", "content": "Hi"}, {"role": "ipython", "content": "42"}]
    sent = body_of(kind, chat(messages=msgs))["messages"]
    assert [m["role"] for m in sent] == ["user", "ipython"]
    assert sent[1]["content"] == "42"
