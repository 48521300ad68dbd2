"""TGI parameters to the vLLM request we send, TGI's validation errors, and the Messages API
request mapping.

Sources: TGI router @ db931fcf `lib.rs` (GenerateParameters, default_parameters: no
`parameters` means do_sample true), `validation.rs` (checks and messages), `server.rs`
(generate_stream_internal: best_of and decoder_input_details refused in streams), server
`utils/tokens.py` NextTokenChooser (greedy unless do_sample or a warper), wire-formats.md section 8.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from adapters import base, registry
from adapters.backends import vllm
from adapters.frontends import openai, tgi, tgi_chat, tgi_encode
from gateway import config, routing
from schemas import canonical, errors

CTX = base.RequestContext()
TARGET = base.Target("http://worker:8000", "org/model")
PROMPT = "What is Deep Learning?"
ABSENT = object()


def upstream(body: dict[str, Any], mode: tgi.Mode = "generate") -> dict[str, Any]:
    """The vLLM request body for a TGI request, after the worker's own check."""
    req = tgi.TgiFrontend(mode).parse(orjson.dumps(body), CTX).request
    vllm.VllmBackend().check(req)
    up = vllm.VllmBackend().build(req, TARGET)
    assert up.url == "http://worker:8000/v1/completions"  # raw prompt, no chat template
    out: dict[str, Any] = orjson.loads(up.body)
    return out


PARAMETERS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("max_new_tokens", {"max_new_tokens": 7}, {"max_tokens": 7}),
    # TGI's default is as many tokens as fit; vLLM reads an explicit null as that.
    ("max_new_tokens default", {}, {"max_tokens": None}),
    ("temperature", {"temperature": 0.5}, {"temperature": 0.5}),
    ("do_sample false is greedy", {"do_sample": False}, {"temperature": 0.0}),
    ("parameters present, do_sample omitted: greedy", {"max_new_tokens": 2}, {"temperature": 0.0}),
    ("do_sample true samples", {"do_sample": True}, {"temperature": ABSENT}),
    ("temperature 1.0 is no warper: greedy", {"temperature": 1.0}, {"temperature": 0.0}),
    ("top_k", {"top_k": 10}, {"top_k": 10, "temperature": ABSENT}),
    ("top_p", {"top_p": 0.9}, {"top_p": 0.9}),
    ("repetition_penalty", {"repetition_penalty": 1.2}, {"repetition_penalty": 1.2}),
    ("frequency_penalty", {"frequency_penalty": -0.5}, {"frequency_penalty": -0.5}),
    ("seed", {"seed": 7, "do_sample": True}, {"seed": 7}),
    ("stop", {"stop": ["\n", "###"]},
     {"stop": ["\n", "###"], "include_stop_str_in_output": True}),
    ("truncate", {"truncate": 64}, {"truncate_prompt_tokens": 64}),
    ("details", {"details": True}, {"logprobs": 0, "return_token_ids": True}),
    ("no details: no logprobs", {"details": False},
     {"logprobs": ABSENT, "return_token_ids": ABSENT}),
    ("top_n_tokens", {"details": True, "top_n_tokens": 3}, {"logprobs": 3}),
    ("decoder_input_details", {"decoder_input_details": True},
     {"prompt_logprobs": 1, "return_token_ids": True, "logprobs": 0}),
    ("best_of", {"best_of": 2, "do_sample": True},
     {"n": 2, "logprobs": 0, "return_token_ids": True}),
    ("best_of 1 is one sequence", {"best_of": 1}, {"n": ABSENT}),
    ("grammar json", {"grammar": {"type": "json", "value": {"properties": {"a": {}}}}},
     {"response_format": {"type": "json_schema", "json_schema": {
         "name": "grammar", "schema": {"properties": {"a": {}}}}}}),
    ("grammar json as text", {"grammar": {"type": "json_object", "value": '{"properties": {}}'}},
     {"response_format": {"type": "json_schema",
                          "json_schema": {"name": "grammar", "schema": {"properties": {}}}}}),
    ("grammar json_schema", {"grammar": {"type": "json_schema", "value": {
        "name": "person", "schema": {"properties": {"n": {"type": "string"}}}}}},
     {"response_format": {"type": "json_schema", "json_schema": {
         "name": "person", "schema": {"properties": {"n": {"type": "string"}}}}}}),
    ("grammar regex", {"grammar": {"type": "regex", "value": "[0-9]+"}},
     {"structured_outputs": {"regex": "[0-9]+"}}),
    ("return_full_text is rendered, not sent", {"return_full_text": True}, {"echo": ABSENT}),
    ("watermark false", {"watermark": False}, {"watermark": ABSENT}),
    ("nulls read as defaults", {"do_sample": None, "stop": None, "details": None,
                                "watermark": None, "best_of": None}, {"stop": ABSENT}),
]


@pytest.mark.parametrize(("params", "expected"), [p[1:] for p in PARAMETERS],
                         ids=[p[0] for p in PARAMETERS])
def test_parameter_reaches_the_worker(params: dict[str, Any], expected: dict[str, Any]) -> None:
    body = upstream({"inputs": PROMPT, "parameters": params})
    assert body["prompt"] == PROMPT and body["stream"] is False
    for key, value in expected.items():
        if value is ABSENT:
            assert key not in body, key
        else:
            assert body[key] == value, key


def test_no_parameters_means_do_sample() -> None:
    """lib.rs default_parameters(): `do_sample: true` when the body has no `parameters`."""
    body = upstream({"inputs": PROMPT})
    assert "temperature" not in body and body["max_tokens"] is None
    assert isinstance(body.pop("seed"), int)  # sampling: a seed is drawn (below)
    again = upstream({"inputs": PROMPT, "parameters": None})
    assert isinstance(again.pop("seed"), int) and again == body


def test_sampling_without_a_seed_draws_one_sends_it_and_reports_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """validation.rs `validate`: `let seed = match seed { None => thread_rng().gen(), ...}` (a
    random u64); the shard reports it when it samples (flash_causal_lm.py generate_token:
    `GeneratedText(..., seed if do_sample else None)`), as details.seed and StreamDetails.seed.
    Greedy requests report null; best_of > 1 sends none (each sequence is a request of its own,
    infer/mod.rs generate_best_of, and validation.rs refuses a seed with best_of > 1)."""
    drawn = iter([2**63 - 1, 7])
    monkeypatch.setattr(tgi, "draw_seed", lambda: next(drawn))
    fe = tgi.TgiFrontend("stream")
    t = fe.parse(orjson.dumps({"inputs": PROMPT, "parameters": {"details": True,
                                                                  "do_sample": True}}), CTX)
    assert t.request.sampling.seed == 2**63 - 1 and t.state.seed == 2**63 - 1
    assert upstream({"inputs": PROMPT, "parameters": {"top_k": 5}})["seed"] == 7
    for params in ({"do_sample": False}, {"do_sample": True, "best_of": 2}):
        t = tgi.TgiFrontend().parse(orjson.dumps({"inputs": PROMPT, "parameters": params}), CTX)
        assert t.request.sampling.seed is None and t.state.seed is None
    own = tgi.TgiFrontend().parse(orjson.dumps({"inputs": PROMPT, "parameters": {"seed": 3}}),
                                  CTX)
    assert own.request.sampling.seed == 3  # the client's seed goes to the worker as it is


def test_stream_asks_for_token_ids_logprobs_and_usage() -> None:
    """Every streamed token carries id and logprob; input_length comes from the usage."""
    body = upstream({"inputs": PROMPT, "parameters": {"max_new_tokens": 3}}, "stream")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["logprobs"] == 0 and body["return_token_ids"] is True


def test_compat_route_streams_by_the_body_flag() -> None:
    assert upstream({"inputs": PROMPT, "stream": True}, "compat")["stream"] is True
    assert upstream({"inputs": PROMPT, "stream": False}, "compat")["stream"] is False
    state = tgi.TgiFrontend("compat").parse(orjson.dumps({"inputs": PROMPT}), CTX).state
    assert isinstance(state, tgi_encode.TgiState)
    assert state.wrap and state.prefix == PROMPT  # array body; return_full_text by default


def test_adapter_id_is_the_model_and_seed_is_reported_only_when_sampling() -> None:
    fe = tgi.TgiFrontend()
    t = fe.parse(orjson.dumps({"inputs": PROMPT, "parameters": {"adapter_id": "my-lora"}}), CTX)
    assert t.request.model == "my-lora"
    greedy = fe.parse(orjson.dumps({"inputs": PROMPT, "parameters": {"seed": 3}}), CTX)
    sampled = fe.parse(orjson.dumps({"inputs": PROMPT, "parameters": {"seed": 3,
                                                                       "do_sample": True}}), CTX)
    assert greedy.state.seed is None and sampled.state.seed == 3


@pytest.mark.parametrize("params", [{"typical_p": 0.5}, {"watermark": True}],
                         ids=["typical_p", "watermark"])
def test_what_vllm_cannot_honour_is_tgis_validation_error(params: dict[str, Any]) -> None:
    t = tgi.TgiFrontend().parse(orjson.dumps({"inputs": PROMPT, "parameters": params}), CTX)
    with pytest.raises(errors.Unsupported) as exc:
        vllm.VllmBackend().check(t.request)
    r = t.render_error(exc.value)
    body = orjson.loads(r.body)
    assert r.status == 422 and body["error_type"] == "validation"
    assert body["error"] == f"Input validation error: `{next(iter(params))}` is not supported " \
        "by this model's worker"


INVALID: list[tuple[dict[str, Any], str]] = [
    ({"temperature": 0}, "`temperature` must be strictly positive"),
    ({"temperature": -1.0}, "`temperature` must be strictly positive"),
    ({"repetition_penalty": 0}, "`repetition_penalty` must be strictly positive"),
    ({"frequency_penalty": 2.5}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ({"top_p": 0.0}, "`top_p` must be > 0.0 and < 1.0"),
    ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
    ({"typical_p": 1.0}, "`typical_p` must be > 0.0 and < 1.0"),
    ({"top_k": 0}, "`top_k` must be strictly positive"),
    ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5"),
    ({"best_of": 2}, "you must use sampling when `best_of` is > 1"),
    ({"best_of": 2, "do_sample": True, "seed": 1}, "`seed` must not be set when `best_of` > 1"),
    ({"best_of": 3, "do_sample": True}, "`best_of` must be > 0 and <= 2. Given: 3"),
    # infer/mod.rs generate_best_of runs validate_best_of before validation.rs `validate`:
    # too many sequences is the answer whatever else is wrong.
    ({"best_of": 3}, "`best_of` must be > 0 and <= 2. Given: 3"),
    ({"best_of": 3, "do_sample": True, "seed": 1}, "`best_of` must be > 0 and <= 2. Given: 3"),
    ({"best_of": 3, "temperature": 0}, "`best_of` must be > 0 and <= 2. Given: 3"),
    ({"top_n_tokens": 6}, "`top_n_tokens` must be >= 0 and <= 5. Given: 6"),
    ({"truncate": 0}, "`truncate` must be strictly positive and less than 4095. Given: 0"),
    ({"grammar": {"type": "json", "value": {"type": "object"}}},
     "grammar is not valid: Grammar must have a 'properties' field"),
    ({"grammar": {"type": "regex", "value": 5}}, "grammar is not supported"),
]


@pytest.mark.parametrize(("params", "message"), INVALID, ids=[m for _, m in INVALID])
def test_tgi_validation(params: dict[str, Any], message: str) -> None:
    body = orjson.dumps({"inputs": PROMPT, "parameters": params})
    # A stream refuses best_of != 1 before these (test_stream_only_refusals).
    modes: list[tgi.Mode] = ["generate", "compat"] if "best_of" in params else \
        ["generate", "stream", "compat"]
    for mode in modes:
        fe = tgi.TgiFrontend(mode)
        with pytest.raises(errors.InvalidRequest) as exc:
            fe.parse(body, CTX)
        assert exc.value.message == message
        r = fe.render_error(exc.value)
        expected = orjson.dumps({"error": f"Input validation error: {message}",
                                 "error_type": "validation"})
        if mode == "stream":  # server.rs: every check runs inside the stream
            assert (r.status, r.body) == (200, b"data: " + expected + b"\n\n")
        else:
            assert (r.status, r.body) == (422, expected)


@pytest.mark.parametrize(("params", "message"), [
    ({"best_of": 2, "do_sample": True}, "`best_of` != 1 is not supported when streaming tokens"),
    ({"decoder_input_details": True},
     "`decoder_input_details` == true is not supported when streaming tokens"),
])
def test_stream_only_refusals(params: dict[str, Any], message: str) -> None:
    body = orjson.dumps({"inputs": PROMPT, "parameters": params})
    tgi.TgiFrontend("generate").parse(body, CTX)
    with pytest.raises(errors.InvalidRequest, match=message):
        tgi.TgiFrontend("stream").parse(body, CTX)


@pytest.mark.parametrize(("body", "status"), [
    (b"{", 400), (b"[]", 422), (b'{"parameters": {}}', 422), (b'{"inputs": ""}', 422),
    (b'{"inputs": ["a"]}', 422), (b'{"inputs": "a", "parameters": 3}', 422),
    (b'{"inputs": "a", "parameters": {"max_new_tokens": -1}}', 422)])
def test_malformed_bodies_are_4xx(body: bytes, status: int) -> None:
    """axum's Json extractor: 400 syntax, 422 data (tgi_extract.py); validation.rs: 422."""
    with pytest.raises(errors.InvalidRequest) as exc:
        tgi.TgiFrontend().parse(body, CTX)
    assert tgi.TgiFrontend().render_error(exc.value).status == status


# ---- the Messages API (/v1/chat/completions) ----


def chat_translator(body: dict[str, Any]) -> base.Translator:
    return openai.OpenAIChatFrontend().parse(orjson.dumps(body), CTX)


def chat(body: dict[str, Any]) -> canonical.InferenceRequest:
    return chat_translator(body).request


MSGS = [{"role": "user", "content": "Hi", "name": None, "tool_calls": None}]


def test_placeholders_are_resolved_by_the_chat_front_end_alone() -> None:
    """TGI's placeholder names mean the default model on /v1/chat/completions (SPEC.md, TGI
    front end); the router resolves real names and aliases only."""
    cfg = config.Config.model_validate(
        {"models": [{"name": "demo", "upstreams": ["http://worker:8000"]}]})
    router = routing.Router(cfg)
    for name in sorted(tgi_chat.PLACEHOLDERS):
        assert isinstance(chat_translator({"model": name, "messages": MSGS}),
                          tgi_chat.ChatTranslator)
        with pytest.raises(errors.ModelNotFound):
            router.resolve(name)


@pytest.mark.parametrize("model", [None, "tgi", "dummy"])
def test_tgi_clients_get_the_default_model_in_tgi_shape(model: str | None) -> None:
    body: dict[str, Any] = {"messages": MSGS}
    if model is not None:
        body["model"] = model
    t = chat_translator(body)
    assert t.request.model is None and isinstance(t, tgi_chat.ChatTranslator)


def test_text_generation_chat_request_is_accepted() -> None:
    """text_generation 0.7.0 `ChatRequest(...).dict()`: every optional field as null."""
    req = chat({"model": "tgi", "messages": MSGS, "repetition_penalty": None,
                "frequency_penalty": None, "logit_bias": None, "logprobs": None,
                "top_logprobs": None, "max_tokens": 5, "n": None, "presence_penalty": None,
                "stream": False, "seed": None, "temperature": None, "top_p": None,
                "tools": None, "tool_choice": None})
    assert req.sampling.max_tokens == 5 and req.sampling.n == 1


def test_tgi_chat_request_forms() -> None:
    req = chat({"model": "tgi", "messages": MSGS, "logit_bias": [0.5],
                "tool_choice": "get_weather", "tool_prompt": "Use tools",
                "tools": [{"type": "function", "function": {"name": "get_weather"}}],
                "top_logprobs": 2})
    assert req.tool_choice == "get_weather" and req.sampling.logit_bias is None
    assert req.top_logprobs == 0 and "tool_prompt" not in req.extra
    # tools and a response_format together are TGI's tool error (test_tgi_chat_errors.py)
    req = chat({"messages": MSGS,
                "response_format": {"type": "json_object", "value": {"properties": {}}}})
    assert req.response_format == {"type": "json_schema", "json_schema": {
        "name": "response_format", "schema": {"properties": {}}}}
    regex = chat({"messages": MSGS, "response_format": {"type": "regex", "value": "a+"}})
    assert regex.response_format is None and regex.extra["structured_outputs"] == {"regex": "a+"}


def test_named_models_stay_plain_openai() -> None:
    t = chat_translator({"model": "demo", "messages": MSGS})
    assert t.request.model == "demo" and isinstance(t, openai.ChatTranslator)
    with pytest.raises(errors.InvalidRequest):
        # OpenAI's schema as before: a temperature above 2 only TGI's reading takes
        chat({"model": "demo", "messages": MSGS, "temperature": 3})


def test_registry_routes() -> None:
    posts = {path for path, _ in registry.INFERENCE_ROUTES}
    gets = dict(registry.STATUS_ROUTES)
    assert {"/generate", "/generate_stream", "/", "/v1/chat/completions"} <= posts
    assert gets["/health"] is tgi.health and gets["/info"] is tgi.info
    # GET / is TGI's health too, for every client but Elasticsearch's (test_elastic_frontend)
    view = base.GatewayView((), None, "0", 0, 1, 1)
    ctx = base.RequestContext(headers={"user-agent": "python-requests/2.32"})
    assert gets["/"](view, ctx) == tgi.health(view, ctx)
    modes = {path: make() for path, make in registry.INFERENCE_ROUTES
             if path in ("/generate", "/generate_stream", "/")}
    assert {p: fe.mode for p, fe in modes.items()} == {  # type: ignore[attr-defined]
        "/generate": "generate", "/generate_stream": "stream", "/": "compat"}
