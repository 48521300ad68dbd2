"""A request reaches the model it names, or a 404 in its protocol's form: never another
model. TGI's placeholder names stand for the default model only when no model has that name
(SPEC.md, TGI front end); `upstream_model` goes to the worker exactly as configured."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from gateway import config
from tests.unit.test_pipeline_respx import call, worker_ok

DEFAULT, OTHER = "http://default:8000", "http://other:8000"
CHAT = [{"role": "user", "content": "Hi"}]


def completion_ok(request: httpx.Request) -> httpx.Response:
    """vLLM's /v1/completions answer "Hello", whole or streamed as it was asked."""
    choice = {"index": 0, "text": "Hello", "logprobs": None, "finish_reason": "length"}
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    whole = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    if not orjson.loads(request.content).get("stream"):
        return httpx.Response(200, json={**whole, "choices": [choice], "usage": usage})
    chunks = [{**whole, "choices": [choice]}, {**whole, "choices": [], "usage": usage}]
    sse = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})


def two_models(other: str, **extra: Any) -> config.Config:
    return config.Config.model_validate({
        "default_model": "main",
        "models": [{"name": "main", "upstreams": [DEFAULT]},
                   {"name": other, "upstreams": [OTHER], **extra}]})


def workers(r: respx.MockRouter) -> tuple[respx.Route, respx.Route]:
    return (r.post(f"{DEFAULT}/v1/chat/completions").mock(side_effect=worker_ok),
            r.post(f"{OTHER}/v1/chat/completions").mock(side_effect=worker_ok))


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["dummy", "tgi"])
async def test_a_model_configured_under_a_placeholder_name_is_that_model(name: str) -> None:
    """huggingface_hub sends "dummy" and text_generation "tgi" for TGI's one model; a gateway
    whose config names a model so must still route that name to it, not to `default_model`
    (the router resolves real names first; placeholders are for names nothing has)."""
    with respx.mock(assert_all_called=False) as r:
        main, other = workers(r)
        resp = await call(r, {"model": name, "messages": CHAT}, two_models(name))
    assert resp.status_code == 200
    assert (main.call_count, other.call_count) == (0, 1)
    assert resp.json()["model"] == name and resp.json()["id"]  # OpenAI's shape, a real id


@pytest.mark.anyio
async def test_a_placeholder_no_model_has_still_means_the_default() -> None:
    with respx.mock(assert_all_called=False) as r:
        main, other = workers(r)
        resp = await call(r, {"model": "dummy", "messages": CHAT}, two_models("other"))
    assert resp.status_code == 200 and (main.call_count, other.call_count) == (1, 0)


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["../other", "other/", "other\x00", "OTHER", "other ", "ｏther",
                                  "main/../other", "%6Fther"])
async def test_a_name_close_to_a_model_is_a_404_never_that_model(name: str) -> None:
    with respx.mock(assert_all_called=False) as r:
        main, other = workers(r)
        resp = await call(r, {"model": name, "messages": CHAT}, two_models("other"))
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    assert main.call_count == other.call_count == 0


@pytest.mark.anyio
@pytest.mark.parametrize("upstream_model", ["org/Model-8B", "../x", "naïve ü", "a%2Fb", " sp "])
async def test_upstream_model_is_sent_exactly_as_configured(upstream_model: str) -> None:
    with respx.mock(assert_all_called=False) as r:
        _, other = workers(r)
        resp = await call(r, {"model": "other", "messages": CHAT},
                          two_models("other", upstream_model=upstream_model))
    assert resp.status_code == 200
    assert orjson.loads(other.calls.last.request.content)["model"] == upstream_model


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/generate", "/invocations"])
async def test_a_default_model_given_by_its_alias_is_that_model(path: str) -> None:
    """Config accepts an alias as `default_model` (aliases are "further names that resolve to
    this model", SPEC.md); requests naming no model went nowhere ("no `default_model`
    configured", 404) and /health stayed 503."""
    cfg = config.Config.model_validate({
        "default_model": "chat", "models": [{"name": "other", "upstreams": [OTHER]},
                                            {"name": "main", "aliases": ["chat"],
                                             "upstreams": [DEFAULT]}]})
    with respx.mock(assert_all_called=False) as r:
        main = r.post(f"{DEFAULT}/v1/completions").mock(side_effect=completion_ok)
        resp = await call(r, {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}, cfg,
                          path=path)
    assert resp.status_code == 200, resp.text
    assert main.call_count == 1
