"""The TGI routes through the real app, with respx-mocked vLLM workers: prefill decoded from
vLLM's `prompt_logprobs`, streams, errors before and after the first byte in each route's form
(TGI server.rs: /generate_stream answers every error as an event after HTTP 200, no `[DONE]`),
the Messages API's placeholder models, and the status routes."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from adapters.frontends import tgi
from gateway import app as gateway_app
from gateway import config, upstream, upstream_clients
from tests.golden import runner
from tests.golden.test_tgi_golden import GOLDEN_SEED
from tests.unit import test_pipeline_respx
from tests.unit.test_pipeline_respx import Broken, call, make_config, worker_ok

COMPLETIONS = r"http://up[12]:8000/v1/completions"
CHAT = r"http://up[12]:8000/v1/chat/completions"
GOLDEN = runner.ROOT / "tgi"
PROMPT = "What is Deep Learning?"
SSE = {"content-type": "text/event-stream"}


@pytest.fixture(autouse=True)
def fixed_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed a sampling request without one gets (tgi.draw_seed), as the goldens have it."""
    monkeypatch.setattr(tgi, "draw_seed", lambda: GOLDEN_SEED)


def golden_body(case: str) -> bytes:
    return (GOLDEN / case / "response.txt").read_bytes().partition(b"\n\n")[2]


@pytest.mark.anyio
async def test_decoder_input_details_fills_prefill_from_vllm_prompt_logprobs() -> None:
    """The worker body follows vLLM 0.11 CompletionResponse (prompt_logprobs per position:
    null first, then {"<id>": {"logprob", "rank", "decoded_token"}})."""
    worker = (GOLDEN / "generate_prefill_top_tokens" / "worker.txt").read_bytes()
    body = orjson.loads((GOLDEN / "generate_prefill_top_tokens" / "request.json").read_bytes())
    with respx.mock(assert_all_called=True) as r:
        route = r.post(url__regex=COMPLETIONS).mock(
            return_value=httpx.Response(200, content=worker))
        resp = await call(r, body, path="/generate")
    assert resp.status_code == 200
    assert resp.content + b"\n" == golden_body("generate_prefill_top_tokens")
    prefill = resp.json()["details"]["prefill"]
    assert prefill[:2] == [{"id": 128000, "text": "", "logprob": None},
                           {"id": 3923, "text": "What", "logprob": -7.868203}]
    sent = orjson.loads(route.calls.last.request.content)
    assert sent["prompt_logprobs"] == 1 and sent["logprobs"] == 2 and sent["return_token_ids"]
    assert sent["model"] == "org/model" and sent["prompt"] == PROMPT


@pytest.mark.anyio
async def test_generate_stream_through_the_app_is_the_golden_bytes() -> None:
    case = GOLDEN / "stream_worker_bytes"
    with respx.mock() as r:
        r.post(url__regex=COMPLETIONS).mock(return_value=httpx.Response(
            200, content=(case / "worker.txt").read_bytes(), headers=SSE))
        resp = await call(r, orjson.loads((case / "request.json").read_bytes()),
                          path="/generate_stream")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.headers["x-accel-buffering"] == "no"
    assert resp.content == golden_body("stream_worker_bytes")
    assert b"[DONE]" not in resp.content


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "stream", "status"), [
    ("/generate_stream", None, 200), ("/generate", None, 503), ("/", True, 200),
    ("/", False, 503)])
async def test_workers_down(path: str, stream: bool | None, status: int) -> None:
    """After bounded retries: /generate_stream's error event after HTTP 200, and so for POST /
    with `"stream": true` (server.rs compat_generate hands it to generate_stream); / and
    /generate answer TGI's JSON body with the gateway's 503 (SPEC.md: a worker down is
    502/503)."""
    body: dict[str, Any] = {"inputs": PROMPT}
    if stream is not None:
        body["stream"] = stream
    with respx.mock(assert_all_called=False) as r:
        r.post(url__regex=COMPLETIONS).mock(side_effect=httpx.ConnectError("refused"))
        resp = await call(r, body, path=path)
    assert resp.status_code == status
    payload = resp.content.removeprefix(b"data: ").removesuffix(b"\n\n")
    err = orjson.loads(payload)
    assert err["error_type"] == "generation" and set(err) == {"error", "error_type"}
    assert err["error"].startswith("Request failed during generation: ")


@pytest.mark.anyio
async def test_mid_stream_break_ends_with_tgis_error_event() -> None:
    first = (b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":'
             b'[{"index":0,"text":" Deep","logprobs":{"text_offset":[0],"token_logprobs":'
             b'[-0.5],"tokens":[" Deep"],"top_logprobs":[{" Deep":-0.5}]},"finish_reason":null,'
             b'"stop_reason":null,"token_ids":[18682]}],"usage":null}\n\n')
    second = first.replace(b" Deep", b" learning").replace(b"18682", b"6975")
    with respx.mock() as r:
        r.post(url__regex=COMPLETIONS).mock(return_value=httpx.Response(
            200, stream=Broken([first, second]), headers=SSE))
        resp = await call(r, {"inputs": PROMPT, "parameters": {"details": True}},
                          make_config(failover_attempts=0), path="/generate_stream")
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in resp.content.split(b"\n\n") if e]
    assert [e.get("index") for e in events] == [1, 2, None]  # both tokens went out first
    assert events[0]["token"] == {"id": 18682, "text": " Deep", "logprob": -0.5,
                                  "special": False}
    assert events[-1]["error_type"] == "generation"


@pytest.mark.anyio
async def test_unknown_adapter_is_a_404_in_tgis_body() -> None:
    with respx.mock(assert_all_called=False) as r:
        resp = await call(r, {"inputs": PROMPT, "parameters": {"adapter_id": "nope"}},
                          path="/generate")
    assert resp.status_code == 404
    assert resp.json() == {"error": "Input validation error: The model `nope` does not exist.",
                           "error_type": "validation"}


@pytest.mark.anyio
@pytest.mark.parametrize("model", ["tgi", "dummy", None])
async def test_messages_api_placeholders_reach_the_default_model(model: str | None) -> None:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}]}
    if model is not None:
        body["model"] = model
    with respx.mock() as r:
        route = r.post(url__regex=CHAT).mock(side_effect=worker_ok)
        resp = await call(r, body)
    assert orjson.loads(route.calls.last.request.content)["model"] == "org/model"
    out = resp.json()
    assert list(out)[:5] == ["object", "id", "created", "model", "system_fingerprint"]
    assert (out["model"], out["id"], out["system_fingerprint"]) == ("demo", "", "3.3.7-native")
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}


async def get(path: str, cfg: config.Config) -> httpx.Response:
    def factory(_: config.Config) -> upstream.UpstreamClient:
        return upstream_clients.HttpxClient(httpx.AsyncClient())

    app = gateway_app.build_app(cfg, factory)
    with respx.mock(assert_all_called=False) as r:
        test_pipeline_respx.healthy(r)
        async with app.router.lifespan_context(app):
            await test_pipeline_respx.probed(app)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://gw") as client:
                return await client.get(path)


@pytest.mark.anyio
async def test_status_routes() -> None:
    down = config.Config.model_validate({"default_model": "demo", "models": [
        {"name": "demo", "backend": "vllm", "upstream_model": "org/model"}]})
    for path in ("/health", "/"):
        ok = await get(path, make_config())
        assert (ok.status_code, ok.content) == (200, b"")
        assert "content-type" not in ok.headers  # server.rs `health` answers `()`
        bad = await get(path, down)
        assert bad.status_code == 503
        assert bad.content == b'{"error":"unhealthy","error_type":"healthcheck"}'
    info = (await get("/info", make_config())).json()
    assert info["model_id"] == "org/model" and info["router"] == "text-generation-router"
    assert info["max_concurrent_requests"] == 1024


def test_stream_tokens_wait_only_until_the_end_of_their_upstream_read() -> None:
    """A token goes out at the end of the read it came in (time to first token), while the
    last token, once its Finish is known, waits for the usage that completes its details."""
    from adapters import base as adapters_base
    from adapters.frontends import tgi as tgi_frontend
    from schemas import events as ev

    fe = tgi_frontend.TgiFrontend("stream")
    t = fe.parse(b'{"inputs":"Hi","parameters":{"details":true,"max_new_tokens":2}}',
                 adapters_base.RequestContext())
    enc = t.encoder(adapters_base.ResponseMeta("x", 1, "m"))
    assert enc.encode(ev.TextDelta(0, " a", [5], None)) == b""
    first = enc.flush()
    assert first.startswith(b'data: {"index":1,"token":{"id":5,"text":" a"')
    assert b'"generated_text":null' in first
    out = enc.encode(ev.TextDelta(0, " b", [6], None)) + enc.encode(ev.Finish(0, "length"))
    assert out == b"" and enc.flush() == b""  # the last token waits for the usage
    last = enc.encode(ev.Usage(3, 2))
    assert b'"index":2' in last and b'"generated_text":" a b"' in last
    assert b'"input_length":3' in last


def test_workers_all_overloaded_render_as_tgi_overloaded() -> None:
    """TGI server.rs: InferError::Overloaded is 429 with error_type "overloaded"; the gateway
    answers so when every upstream said it was overloaded."""
    from adapters.frontends import tgi as tgi_frontend
    from schemas import errors as gateway_errors

    r = tgi_frontend.TgiFrontend("generate").render_error(
        gateway_errors.UpstreamUnavailable("Model is overloaded", status=429))
    assert r.status == 429
    assert r.body == b'{"error":"Model is overloaded","error_type":"overloaded"}'
