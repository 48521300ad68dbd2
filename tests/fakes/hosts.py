"""The real gateway app in-process, its upstream client routed to fake workers by host name.

`serve(cfg, {"triton": app})` yields an httpx client for the gateway whose upstream requests to
`http://triton:...` reach that ASGI app (httpx.ASGITransport), so the whole path — frontend,
router, backend, pipeline, decoder, encoder — runs on the worker's real bytes. For a worker as
a real process, pass no fakes and the gateway uses its production aiohttp client.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from starlette.types import ASGIApp

from gateway import app as gateway_app
from gateway import config, upstream, upstream_clients


class Hosts(httpx.AsyncBaseTransport):
    """One ASGI app per upstream host name."""

    def __init__(self, apps: Mapping[str, ASGIApp]):
        self._by_host = {host: httpx.ASGITransport(app=a) for host, a in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._by_host[request.url.host].handle_async_request(request)


@contextlib.asynccontextmanager
async def serve(cfg: config.Config, fakes: Mapping[str, ASGIApp] | None = None
                ) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the gateway for `cfg`; `fakes` (host -> app) stand in for its workers."""
    if fakes is None:
        app = gateway_app.build_app(cfg)
    else:
        def factory(_: config.Config) -> upstream.UpstreamClient:
            return upstream_clients.HttpxClient(httpx.AsyncClient(transport=Hosts(fakes)))
        app = gateway_app.build_app(cfg, factory)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw", timeout=10) as client:
            yield client


def sdk(client: httpx.AsyncClient) -> Any:
    """The openai SDK over the in-process gateway (typed loosely: its overloads are not the
    point)."""
    import openai

    http: Any = client  # openai 3.x types its client as httpx2's, which httpx's satisfies
    return openai.AsyncOpenAI(base_url="http://gw/v1", api_key="k", http_client=http,
                              max_retries=0)


def sent(fake: Any) -> tuple[str, dict[str, Any]]:
    """The last request a fake worker received: its path and body."""
    path, body = fake.state.requests[-1]
    return path, body
