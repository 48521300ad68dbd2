"""CORS on the gateway's routes, on both of its paths: its own HTTP server (gateway.http_server,
in this process on a loopback port) and the ASGI app (gateway.app.FastPaths, as any ASGI server
runs it). The worker is the simulator in process (tests/matrix/harness.py).

What a browser needs, as vLLM's API server gives it (vllm/entrypoints/openai/api_server.py
build_app wraps the whole app in Starlette's CORSMiddleware; its AuthenticationMiddleware lets
every OPTIONS through, vllm/entrypoints/openai/server_utils.py): a preflight answered before
any route, without an API key, whatever the load; the allow-origin field on every other answer
(streams, errors, status routes, /metrics, 404/405) so that the page can read it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway import app as gateway_app
from gateway import config, http_server, listener, serving, upstream, upstream_clients
from tests.matrix import harness

pytestmark = pytest.mark.anyio

SITE = "https://chat.example"
PREFLIGHT = {"origin": SITE, "access-control-request-method": "POST",
             "access-control-request-headers": "authorization, content-type"}
MSGS = [{"role": "user", "content": "Hi [[sim tokens=3]]"}]
KEY = {"authorization": "Bearer k1"}


def _config(**server: Any) -> config.Config:
    base = harness.make_config("vllm", "").model_dump(mode="json")
    base["server"] = {**base["server"], "api_keys": ["k1"], **server}
    return config.Config.model_validate(base)


@contextlib.asynccontextmanager
async def gateway(path: str, cfg: config.Config
                  ) -> AsyncIterator[tuple[httpx.AsyncClient, serving.Services]]:
    """A client of the gateway for `cfg`: over its own server (`native`) or ASGI (`asgi`)."""
    workers = harness.Fakes()

    def factory(_: Any) -> upstream.UpstreamClient:
        return upstream_clients.HttpxClient(httpx.AsyncClient(transport=workers, timeout=20))

    app = gateway_app.build_app(cfg, factory)
    services: serving.Services = app.state.services
    async with app.lifespan():
        if path == "asgi":
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://gw", timeout=20) as client:
                yield client, services
            return
        server = listener.Server(app, cfg.server)
        srv = await asyncio.get_running_loop().create_server(
            lambda: http_server.Connection(server), "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         timeout=20) as client:
                yield client, services
        finally:
            srv.close()
            for conn in list(server.connections):
                conn.close()


PATHS = pytest.mark.parametrize("path", ["native", "asgi"])


@PATHS
async def test_a_preflight_needs_no_key_and_no_place_in_the_admission_limit(path: str) -> None:
    """The preflight is answered while the one admission place is taken (a POST then is a 429,
    and a browser can read that 429) and with API keys set (browsers send no credentials on a
    preflight, Fetch standard, CORS-preflight fetch)."""
    async with gateway(path, _config(max_concurrent_requests=1)) as (client, services):
        assert services.admission.enter()  # a request in flight
        try:
            pre = await client.options("/v1/chat/completions", headers=PREFLIGHT)
            busy = await client.post("/v1/chat/completions", headers={"origin": SITE, **KEY},
                                     json={"model": "m", "messages": MSGS})
        finally:
            services.admission.leave()
    assert (pre.status_code, pre.text) == (200, "OK")
    assert pre.headers["access-control-allow-origin"] == "*"
    assert pre.headers["access-control-allow-headers"] == "authorization, content-type"
    assert "POST" in pre.headers["access-control-allow-methods"].split(", ")
    assert pre.headers["access-control-max-age"] == "600"
    assert busy.status_code == 429
    assert busy.headers["access-control-allow-origin"] == "*"


STREAMS = {
    "openai": ("/v1/chat/completions", {"model": "m", "messages": MSGS, "stream": True}),
    "lmi": ("/invocations", {"messages": MSGS, "stream": True}),
    "tgi": ("/generate_stream", {"inputs": "Hi [[sim tokens=3]]",
                                 "parameters": {"max_new_tokens": 3}}),
    "elastic": ("/_inference/chat_completion/m/_stream", {"messages": MSGS}),
}


@PATHS
@pytest.mark.parametrize("protocol", STREAMS)
async def test_every_protocols_stream_can_be_read_by_the_page(path: str, protocol: str) -> None:
    route, body = STREAMS[protocol]
    async with gateway(path, _config()) as (client, _):
        async with client.stream("POST", route, json=body,
                                 headers={"origin": SITE, **KEY}) as resp:
            text = b"".join([part async for part in resp.aiter_bytes()])
    assert resp.status_code == 200, text
    assert resp.headers["access-control-allow-origin"] == "*"
    assert resp.headers["vary"] == "Origin"
    assert text  # the stream itself, unchanged


@PATHS
@pytest.mark.parametrize(("method", "route", "headers", "status"), [
    ("POST", "/v1/chat/completions", {}, 401),  # no key: the page can tell the user why
    ("POST", "/v1/chat/completions", KEY, 404),  # unknown model, in OpenAI's error body
    ("GET", "/v1/models", KEY, 200),
    ("GET", "/info", KEY, 200),
    ("GET", "/health", {}, None),  # 503 until the first probe, 200 after: either readable
    ("GET", "/metrics", {}, 200),
    ("GET", "/v1/nowhere", KEY, 404),
    ("OPTIONS", "/v1/chat/completions", {}, 405),  # an OPTIONS that is no preflight
])
async def test_every_answer_names_the_allowed_origin(path: str, method: str, route: str,
                                                     headers: dict[str, str],
                                                     status: int | None) -> None:
    body = {"model": "nope", "messages": MSGS} if method == "POST" else None
    async with gateway(path, _config()) as (client, _):
        resp = await client.request(method, route, json=body,
                                    headers={"origin": SITE, **headers})
    assert status is None or resp.status_code == status
    assert resp.headers["access-control-allow-origin"] == "*"
    assert resp.headers["vary"] == "Origin"
    if status == 405:
        assert resp.headers["allow"] == "POST"


@PATHS
async def test_listed_origins_are_named_back_and_others_are_not(path: str) -> None:
    cfg = _config(cors={"allow_origins": [SITE], "allow_credentials": True,
                        "expose_headers": ["x-request-id"]})
    async with gateway(path, cfg) as (client, _):
        ok = await client.get("/v1/models", headers={"origin": SITE, **KEY})
        other = await client.get("/v1/models", headers={"origin": "https://evil.example", **KEY})
        refused = await client.options("/v1/models", headers={
            **PREFLIGHT, "origin": "https://evil.example"})
        plain = await client.get("/v1/models", headers=KEY)
    assert ok.headers["access-control-allow-origin"] == SITE
    assert ok.headers["access-control-allow-credentials"] == "true"
    assert ok.headers["access-control-expose-headers"] == "x-request-id"
    assert "access-control-allow-origin" not in other.headers
    assert (refused.status_code, refused.text) == (400, "Disallowed CORS origin")
    assert "access-control-allow-origin" not in refused.headers
    assert plain.headers["vary"] == "Origin"  # caches keep it apart from a browser's
    assert "access-control-allow-origin" not in plain.headers


@PATHS
async def test_cors_off_leaves_options_a_405(path: str) -> None:
    """`allow_origins: []`: no CORS at all, as before it existed: a preflight is an OPTIONS
    like any other, a 405 naming the methods the path takes (RFC 9110 section 15.5.6)."""
    async with gateway(path, _config(cors={"allow_origins": []})) as (client, _):
        pre = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        chat = await client.get("/v1/models", headers={"origin": SITE, **KEY})
    assert pre.status_code == 405
    assert pre.headers["allow"] == "POST"
    assert not [k for k in pre.headers if k.startswith("access-control-")]
    assert "access-control-allow-origin" not in chat.headers
    assert "vary" not in chat.headers
