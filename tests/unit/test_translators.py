"""One translator per request (Envoy AI Gateway's per-request translator): `Frontend.parse`
returns an object holding that request's typed state, which its encoder, whole answer and
errors read; the frontend itself, shared by every request of its route, holds none. Also: a
body is JSON-decoded once, whichever front end reads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import respx

from adapters import base, registry
from adapters.frontends import elastic, lmi, lmi_render, tgi, tgi_chat
from adapters.frontends import elastic_encode as es
from adapters.frontends import openai as openai_frontend
from gateway import config
from schemas import errors
from tests.unit.test_pipeline_respx import UP1, call

MSGS = [{"role": "user", "content": "Hi"}]


def context(path: str = "/", params: dict[str, str] | None = None,
            options: dict[str, Any] | None = None) -> base.RequestContext:
    opts = {"name": "demo", "lmi": {}, "elastic": {"framing": "documented"}, **(options or {})}

    def model_options(name: str | None) -> dict[str, Any]:
        return opts if name in (None, "demo") else {}

    return base.RequestContext(path, params or {}, {"content-type": "application/json"},
                               model_options)


# (route path, a valid body, its path parameters) for every inference route.
BODIES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "/v1/chat/completions": ({"model": "demo", "messages": MSGS}, {}),
    "/v1/completions": ({"model": "demo", "prompt": "Hi"}, {}),
    "/generate": ({"inputs": "Hi"}, {}),
    "/generate_stream": ({"inputs": "Hi"}, {}),
    "/": ({"inputs": "Hi"}, {}),
    "/_inference/{id}": ({"input": "Hi"}, {"id": "demo"}),
    "/_inference/{id}/_unified": ({"messages": MSGS}, {"id": "demo"}),
    "/_inference/{id}/_stream": ({"messages": MSGS}, {"id": "demo"}),
    "/_inference/chat_completion/{id}/_unified": ({"messages": MSGS}, {"id": "demo"}),
    "/_inference/chat_completion/{id}/_stream": ({"messages": MSGS}, {"id": "demo"}),
    "/_inference/chat_completion/{id}": ({"messages": MSGS}, {"id": "demo"}),
    "/_inference/completion/{id}": ({"input": "Hi"}, {"id": "demo"}),
    "/_inference/completion/{id}/_stream": ({"input": "Hi"}, {"id": "demo"}),
    # a task type in another case: TaskType.fromString upper-cases it
    "/_inference/{task_type}/{id}": ({"input": "Hi"}, {"task_type": "Completion", "id": "demo"}),
    "/invocations": ({"messages": MSGS}, {}),
    "/predictions/{model}": ({"messages": MSGS}, {"model": "demo"}),
    "/predictions/{model}/{version}": ({"messages": MSGS}, {"model": "demo", "version": "1"}),
}
ROUTES = dict(registry.INFERENCE_ROUTES)


def test_every_route_has_a_body_here() -> None:
    assert set(BODIES) == set(ROUTES)


@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_translator_renders_every_error_class(path: str) -> None:
    """An error after parse is the translator's; for these requests it answers as the route's
    frontend does (their schema adds nothing to an error's form)."""
    body, params = BODIES[path]
    fe = ROUTES[path]()
    t = fe.parse(orjson.dumps(body), context(path, params))
    assert t.request.messages is not None or t.request.prompts
    for cls in errors.all_error_classes():
        exc = cls("something went wrong", field="x")
        mine, route = t.render_error(exc), fe.render_error(exc)
        assert 200 <= mine.status < 600 and mine.body
        assert (mine.status, mine.media_type, mine.body, mine.headers) == \
            (route.status, route.media_type, route.body, route.headers), cls.__name__


Case = tuple[Callable[[], base.Frontend], dict[str, Any], base.RequestContext]
DECODED_ONCE: dict[str, Case] = {
    "openai chat": (openai_frontend.OpenAIChatFrontend, {"model": "demo", "messages": MSGS},
                    context()),
    "tgi placeholder chat": (openai_frontend.OpenAIChatFrontend,
                             {"model": "tgi", "messages": MSGS, "n": None}, context()),
    "model-less chat": (openai_frontend.OpenAIChatFrontend, {"messages": MSGS}, context()),
    "openai completion": (openai_frontend.OpenAICompletionsFrontend,
                          {"model": "demo", "prompt": "Hi"}, context()),
    "lmi chat": (lmi.LmiFrontend, {"messages": MSGS}, context("/invocations")),
    "lmi completion": (lmi.LmiFrontend, {"prompt": "Hi"}, context("/invocations")),
    "lmi inputs": (lmi.LmiFrontend, {"inputs": "Hi"}, context("/invocations")),
    "tgi generate": (tgi.TgiGenerateFrontend, {"inputs": "Hi"}, context("/generate")),
    "elastic chat": (elastic.ElasticChatFrontend, {"messages": MSGS},
                     context("/_inference/demo/_stream", {"id": "demo"})),
    "elastic completion": (elastic.ElasticCompletionFrontend, {"input": "Hi"},
                           context("/_inference/completion/demo", {"id": "demo"})),
}


@pytest.mark.parametrize("case", sorted(DECODED_ONCE))
def test_a_body_is_decoded_once(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsers take the decoded object: no front end re-encodes a body for another to decode
    (TGI's chat reading and LMI's `messages` / `prompt` bodies use the OpenAI parsers)."""
    make, body, ctx = DECODED_ONCE[case]
    raw = orjson.dumps(body)
    loads = orjson.loads
    calls: list[object] = []

    def counted(data: Any) -> Any:
        calls.append(data)
        return loads(data)

    monkeypatch.setattr(orjson, "loads", counted)
    make().parse(raw, ctx)
    assert calls == [raw]


def test_tgi_placeholders_pick_tgis_translator_and_the_default_model() -> None:
    fe = openai_frontend.OpenAIChatFrontend()
    for model in (None, *sorted(tgi_chat.PLACEHOLDERS)):
        body = {"messages": MSGS} if model is None else {"model": model, "messages": MSGS}
        t = fe.parse(orjson.dumps(body), context())
        assert isinstance(t, tgi_chat.ChatTranslator) and t.request.model is None
    named = fe.parse(orjson.dumps({"model": "demo", "messages": MSGS}), context())
    assert isinstance(named, openai_frontend.ChatTranslator) and named.request.model == "demo"


def test_translators_of_one_frontend_do_not_share_state() -> None:
    """Requests in flight together on one frontend keep their own framing and schema."""
    fe = elastic.ElasticChatFrontend()
    ctx = {"id": "demo"}
    server = fe.parse(orjson.dumps({"messages": MSGS}),
                      context("/_inference/demo/_stream", ctx, {"elastic": {"framing": "server"}}))
    plain = fe.parse(orjson.dumps({"messages": MSGS}), context("/_inference/demo/_stream", ctx))
    exc = errors.UpstreamBroken("worker failed")
    assert server.render_error(exc).body.startswith(es.BOM + b"event: error\n")
    assert plain.render_error(exc).body.startswith(b"event: error\n")

    fe_lmi = lmi.LmiFrontend()
    dynamic = fe_lmi.parse(orjson.dumps({"inputs": ["a", "b"]}), context("/invocations"))
    rolling = fe_lmi.parse(orjson.dumps({"inputs": "a"}), context("/invocations"))
    assert (dynamic.state.schema, rolling.state.schema) == ("dynamic", "rolling")
    assert b'"message":"invoke handler failure"' in dynamic.render_error(exc).body
    assert rolling.render_error(exc).body == b'{"error":"worker failed","code":502}'
    assert fe_lmi.render_error(exc).body == rolling.render_error(exc).body


def test_a_dynamic_batch_refused_while_parsing_keeps_its_schemas_body() -> None:
    """Known before validation (a list of `inputs`), the schema rides on the refusal
    (lmi_render.SchemaNote): the frontend's render_error sees only the exception."""
    fe = lmi.LmiFrontend()
    with pytest.raises(errors.InvalidRequest) as caught:
        fe.parse(orjson.dumps({"inputs": ["a", ""]}), context("/invocations"))
    note = base.note_of(caught.value, lmi_render.SchemaNote)
    assert note is not None and note.state.schema == "dynamic"
    r = fe.render_error(caught.value)
    assert r.status == 424 and orjson.loads(r.body) == {
        "code": 424, "message": "invoke handler failure", "error": "`inputs` must not be empty"}
    with pytest.raises(errors.InvalidRequest) as rolling:
        fe.parse(orjson.dumps({"inputs": ""}), context("/invocations"))
    assert base.note_of(rolling.value, lmi_render.SchemaNote) is None
    assert fe.render_error(rolling.value).body == \
        b'{"error":"`inputs` must not be empty","code":424}'


@pytest.mark.anyio
async def test_an_error_after_parse_takes_the_requests_form_end_to_end() -> None:
    """Serving hands errors after parse (here: no such model) to the request's translator."""
    cfg = config.Config.model_validate({"default_model": "demo", "models": [
        {"name": "demo", "backend": "vllm", "upstreams": [UP1]}]})
    with respx.mock(assert_all_called=False) as r:
        r.post(url__regex=r".*").mock(return_value=httpx.Response(500))
        dynamic = await call(r, {"inputs": ["a", "b"]}, cfg, path="/predictions/nope")
        rolling = await call(r, {"inputs": "a"}, cfg, path="/predictions/nope")
    assert dynamic.status_code == rolling.status_code == 404
    assert dynamic.json() == {"code": 404, "message": "invoke handler failure",
                              "error": "The model `nope` does not exist."}
    assert rolling.json() == {"error": "The model `nope` does not exist.", "code": 404}
