"""Hypothesis: whatever body a front end accepts is built for every worker protocol, or refused
with a 4xx in the caller's own error body (SPEC.md: bad input is never a bare 500; a worker
that cannot do what was asked is a clear `Unsupported`).

Each front end parses plausible-but-arbitrary JSON (each protocol's real field names, values
of any JSON type) as gateway.serving does; an accepted request then goes through what the
pipeline runs before any I/O: the route's `check`, the whole/stream plan (gateway.whole, with
and without the model's tokenizer), `build` (its body JSON bytes, its url and headers
strings), the decoder, the prefix key, a continuation where the stream is resumable, and the
translator's encoder (one token and a finish per choice, usage), whole render of an empty fold
and error render. Each step either succeeds or raises a RequestError, rendered as a 4xx in the
protocol's error body; anything else is a bug. (A JSON integer past 64 bits reads as a float:
orjson.)

Run with several seeds (`--hypothesis-seed=N`) when a front end or worker changes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from adapters import base, registry
from adapters.frontends import elastic, lmi, openai, openai_encode, tgi
from gateway import affinity, config, progress, routing, whole
from schemas import canonical, errors
from schemas import elastic as es_wire
from schemas import events as ev
from schemas import lmi as lmi_wire
from schemas import openai as oa_wire
from schemas import tgi as tgi_wire

URL = "http://127.0.0.1:9"
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
WORKERS = ["vllm", "trtllm", "triton", "triton+template", "tgi", "openai"]


@functools.cache
def router(worker: str, lmi_options: tuple[bool, str]) -> routing.Router:
    backend, _, template = worker.partition("+")
    model: dict[str, Any] = {"name": "m", "backend": backend, "upstreams": [URL],
                             "lmi": {"tgi_compat": lmi_options[0],
                                     "output_formatter": lmi_options[1]}}
    if template:
        model["chat_template"] = TEMPLATE
    return routing.Router(config.Config.model_validate({"models": [model]}))


# -- values ---------------------------------------------------------------------------------

HUGE = st.sampled_from([2**31, 2**63, 2**64 + 1, -(2**63) - 1, 10**30, -1, 0, 1e308, -1e308])
junk = st.recursive(
    st.none() | st.booleans() | st.integers() | HUGE
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6)
small = (st.integers(-2, 300) | st.floats(-3, 3, allow_nan=False) | st.booleans()
         | st.just(0) | st.just(1) | st.none() | HUGE | st.integers()
         | st.floats(allow_nan=False, allow_infinity=False))
texts = st.text(max_size=6) | st.sampled_from(["", "\n", "stop", "<|eot_id|>"])
strings = texts | st.lists(texts, max_size=3)
value = small | small | strings | junk  # any field: most often a plausible value

parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "text", "image_url"])},
                                       optional={"text": texts | texts | junk}), max_size=2)
call = st.fixed_dictionaries({"id": texts, "type": st.just("function"),
                              "function": st.fixed_dictionaries(
                                  {"name": texts},
                                  optional={"arguments": texts | st.just('{"a": 1}') | junk})})
ROLES = ["system", "user", "assistant", "tool", "developer"]
turn = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES)},
    optional={"content": texts | texts | parts | st.none(),
              "tool_calls": st.lists(call, max_size=2), "tool_call_id": texts})
odd_turn = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES) | junk},
    optional={"content": texts | parts | junk, "tool_calls": st.lists(call, max_size=2) | junk,
              "tool_call_id": texts | junk, "name": texts | junk})
messages = st.lists(turn | turn | turn | odd_turn, min_size=1, max_size=3) | junk
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": texts}, optional={"parameters": st.just({"type": "object"}) | junk,
                               "description": texts, "strict": small})})

PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "messages": messages,
    "prompt": strings | st.lists(st.integers(-1, 2**40), max_size=3)
    | st.lists(st.lists(st.integers(0, 50), max_size=2), max_size=2) | junk,
    "inputs": strings | junk, "input": strings | junk,
    "tools": st.lists(tool, max_size=2) | junk,
    "tool_choice": st.sampled_from(["auto", "none", "required"])
    | st.just({"type": "function", "function": {"name": "f"}}) | junk,
    "stream_options": st.fixed_dictionaries({}, optional={
        "include_usage": small, "continuous_usage_stats": small}) | junk,
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}, {
        "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}])
    | junk,
    "grammar": st.sampled_from([{"type": "json", "value": {"type": "object"}},
                                {"type": "regex", "value": "a+"}]) | junk,
    "logit_bias": st.dictionaries(st.sampled_from(["1", "50", "x"]), small, max_size=2) | junk,
    "model": st.sampled_from([None, "m", "tgi", "dummy", "", "other"]) | junk,
    "stream": st.booleans() | st.booleans() | junk,
}
# vLLM's own extras a client may add to an OpenAI body (ChatCompletionRequest's)
VLLM_EXTRAS = ["guided_json", "guided_regex", "chat_template_kwargs", "add_generation_prompt",
               "continue_final_message", "echo", "include_stop_str_in_output",
               "spaces_between_special_tokens", "bad_words", "allowed_token_ids"]


def fields(names: list[str], required: tuple[str, ...] = ()) -> st.SearchStrategy[Any]:
    """The required fields and up to four others (more are almost never all valid)."""
    some = st.lists(st.sampled_from([n for n in names if n not in required]), max_size=4,
                    unique=True)
    return st.tuples(st.fixed_dictionaries({n: PLAUSIBLE.get(n, value) for n in required}),
                     some.flatmap(lambda ns: st.fixed_dictionaries(
                         {n: PLAUSIBLE.get(n, value) for n in ns}))
                     ).map(lambda t: {**t[0], **t[1]})


def names(model: Any) -> list[str]:
    return [f.alias or n for n, f in model.model_fields.items()]


CHAT = names(oa_wire.ChatCompletionRequest) + VLLM_EXTRAS
COMPLETION = names(oa_wire.CompletionRequest) + VLLM_EXTRAS
lmi_params = st.dictionaries(st.sampled_from(names(lmi_wire.GenerationParameters)), value,
                             max_size=5) | junk
tgi_params = st.dictionaries(st.sampled_from(names(tgi_wire.GenerateParameters)), value,
                             max_size=5) | junk

# -- front ends: (name, frontend, path params, body) ------------------------------------------

Make = Callable[[], base.Frontend]
FRONTS: list[tuple[str, Make, dict[str, str], st.SearchStrategy[Any]]] = [
    ("openai-chat", openai.OpenAIChatFrontend, {}, fields(CHAT, ("messages",))),
    ("tgi-chat", openai.OpenAIChatFrontend, {}, st.tuples(  # TGI's placeholder model names
        fields(CHAT, ("messages",)), st.sampled_from([None, "tgi", "dummy"])).map(
        lambda t: {**t[0], "model": t[1]})),
    ("openai-completions", openai.OpenAICompletionsFrontend, {}, fields(COMPLETION, ("prompt",))),
    ("lmi-inputs", lmi.LmiFrontend, {}, st.fixed_dictionaries(
        {"inputs": texts | junk}, optional={"parameters": lmi_params, "stream": value})),
    ("lmi-batch", lmi.LmiFrontend, {"model": "m"}, st.fixed_dictionaries(
        {"inputs": st.lists(texts, max_size=3)}, optional={"parameters": lmi_params})),
    ("lmi-messages", lmi.LmiFrontend, {}, fields(CHAT, ("messages",))),
    ("lmi-prompt", lmi.LmiFrontend, {"model": "m"}, fields(COMPLETION, ("prompt",))),
    ("tgi-generate", lambda: tgi.TgiFrontend("generate"), {}, st.fixed_dictionaries(
        {"inputs": texts | junk}, optional={"parameters": tgi_params})),
    ("tgi-stream", lambda: tgi.TgiFrontend("stream"), {}, st.fixed_dictionaries(
        {"inputs": texts | junk}, optional={"parameters": tgi_params})),
    ("tgi-compat", lambda: tgi.TgiFrontend("compat"), {}, st.fixed_dictionaries(
        {"inputs": texts | junk}, optional={"parameters": tgi_params, "stream": value})),
    ("elastic-unified", elastic.ElasticChatFrontend, {"id": "m"},
     fields(names(es_wire.UnifiedRequest), ("messages",))),
    ("elastic-completion", elastic.ElasticCompletionFrontend, {"id": "m"},
     fields(names(es_wire.CompletionRequest), ("input",))),
]
TIMEOUTS = config.Timeouts()
# none; JSON's media type; Elasticsearch's own OpenAI client (answered in its framing)
HEADERS = [{}, {"content-type": "application/json"},
           {"user-agent": f"{openai_encode.ELASTICSEARCH_USER_AGENT}/9.0"}]


def error_shape(front: str, r: base.Rendered) -> None:
    """A refusal: a 4xx whose body is the protocol's error form (TGI's streaming chat
    refuses in-band, in a 200 stream: tgi_chat.refusal)."""
    if r.media_type == "text/event-stream":  # an error event (Elastic's unified API; TGI's
        data = next(x for x in r.body.split(b"\n") if x.startswith(b"data:"))  # in a 200)
        body = orjson.loads(data.removeprefix(b"data:"))
        if r.status == 200:
            error = body["error"]
            assert (400 <= error["http_status_code"] < 500 if isinstance(error, dict)
                    else body["error_type"] == "validation"), r.body
            return
    else:
        body = None
    assert 400 <= r.status < 500, (r.status, r.body)
    if r.media_type.startswith("text/plain"):  # axum's own rejection of a body (TGI)
        assert front.startswith("tgi") and r.body, (front, r.body)
        return
    body = orjson.loads(r.body) if body is None else body
    if isinstance(body, dict) and isinstance(body.get("error"), str) and "error_type" in body:
        tgi_wire.ErrorResponse.model_validate(body)  # TGI, and TGI's Messages API
    elif front.startswith("openai"):
        assert isinstance(body["error"]["message"], str), body
    elif front.startswith("lmi"):
        model = lmi_wire.DynamicBatchError if "message" in body else lmi_wire.Error
        model.model_validate(body)
    elif front.startswith("elastic"):
        if "status" in body:
            (es_wire.SimpleError if isinstance(body["error"], str)
             else es_wire.EsError).model_validate(body)
        else:
            es_wire.UnifiedError.model_validate(body)
    else:
        raise AssertionError((front, body))


def built(t: base.Translator, router: routing.Router, tokenizer: bool) -> None:
    """What the gateway runs on a parsed request before any I/O (gateway.serving, pipeline);
    `tokenizer`: the model has one (a whole answer with per-token details stays one body)."""
    req = t.request
    route = router.resolve(req.model)
    route.backend.check(req)
    meta = base.ResponseMeta("id", 1, req.model or route.name, "rid", route.options)
    sent = req if req.stream else whole.plan(route.backend, req, TIMEOUTS, tokenizer)[0]
    up = route.backend.build(sent, base.Target(URL, route.upstream_model, route.options))
    assert isinstance(up.url, str) and isinstance(up.method, str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in up.headers.items())
    assert isinstance(up.body, bytes)
    orjson.loads(up.body)
    route.decoder(sent, up.streaming)
    affinity.prefix_key(sent)
    if req.stream:
        if progress.resumable(sent, route.backend, route.options):
            route.backend.continuation(progress.one_choice(sent), "So", 1, route.options)
        enc = t.encoder(meta)
        for i in range(req.choice_count):
            enc.encode(ev.TextDelta(i, "x", [7], [ev.TokenLogprob("x", -0.5, id=7)]))
            enc.encode(ev.Finish(i, "eos"))
        enc.encode(ev.Usage(1, req.choice_count))
        assert isinstance(enc.flush() + enc.finish(), bytes)
        assert isinstance(t.encoder(meta).fail(errors.UpstreamBroken("cut")), bytes)
    else:
        done = canonical.Completion.fold((), req.choice_count, req.per_token)
        assert t.render(done, meta).status == 200


@pytest.mark.parametrize("worker", WORKERS)
@pytest.mark.parametrize("front", [f[0] for f in FRONTS])
@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(),
       lmi_options=st.tuples(st.booleans(), st.sampled_from(["jsonlines", "sse"])),
       tokenizer=st.booleans(), headers=st.sampled_from(HEADERS))
def test_an_accepted_request_is_built_or_refused(front: str, worker: str, data: st.DataObject,
                                                 lmi_options: tuple[bool, str],
                                                 tokenizer: bool, headers: dict[str, str]
                                                 ) -> None:
    _, make, path_params, bodies = next(f for f in FRONTS if f[0] == front)
    body = data.draw(bodies, label="body")
    r = router(worker, lmi_options)
    ctx = base.RequestContext("/", path_params, headers, r.options)
    frontend = make()
    answerer: base.Frontend | base.Translator = frontend
    try:
        answerer = t = frontend.parse(json.dumps(body).encode(), ctx)  # big ints too
        event("parsed")
        built(t, r, tokenizer)
    except errors.RequestError as exc:
        event(f"refused: {type(exc).__name__}")
        error_shape(front, answerer.render_error(exc))
        return
    event("built")
    # the request served: its in-flight refusals render in its own form too
    error_shape(front, answerer.render_error(errors.Unsupported("cannot", field="x")))


def test_fronts_and_workers_are_all_covered() -> None:
    """Every inference front end above is a registered one (the list cannot go stale)."""
    routes = {make.__name__ if isinstance(make, type) else "" for _, make in
              registry.INFERENCE_ROUTES}
    assert {"OpenAIChatFrontend", "OpenAICompletionsFrontend", "LmiFrontend",
            "TgiGenerateFrontend", "ElasticChatFrontend", "ElasticCompletionFrontend"} <= routes
    assert {w.partition("+")[0] for w in WORKERS} == set(registry.BACKENDS)
