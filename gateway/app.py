"""The Starlette application: routes of every client protocol over one shared pipeline."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from adapters.frontends import openai as openai_frontend
from gateway import config, pipeline, routing, serving, supervisor, upstream

ClientFactory = Callable[[config.Config], upstream.UpstreamClient]


def aiohttp_client(cfg: config.Config) -> upstream.UpstreamClient:
    return upstream.AiohttpClient(cfg.server.timeouts.connect)


def build_app(cfg: config.Config, client_factory: ClientFactory = aiohttp_client) -> Starlette:
    """The gateway for `cfg`; `client_factory` makes the upstream client inside the loop."""
    router = routing.Router(cfg)
    services = serving.Services(cfg, router, pipeline.Pipeline(_Unstarted(), cfg.server),
                                keys=frozenset(cfg.server.api_keys))
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client = client_factory(cfg)
        services.pipeline.client = client
        workers = supervisor.Supervisor(cfg, router, client)
        app.state.supervisor = workers
        try:
            await workers.start()
            yield
        finally:
            await workers.stop()
            await client.aclose()

    async def models(request: Request) -> Response:
        data = [{"id": name, "object": "model", "created": started, "owned_by": "gateway"}
                for r in router.routes.values() for name in (r.name, *r.config.aliases)]
        return JSONResponse({"object": "list", "data": data})

    async def health(request: Request) -> Response:
        if router.default is not None and router.default.upstreams.all:
            return Response(status_code=200)
        return JSONResponse({"error": "unhealthy", "error_type": "healthcheck"}, status_code=503)

    def endpoint(frontend: object) -> serving.ProtocolEndpoint:
        return serving.ProtocolEndpoint(frontend, services)  # type: ignore[arg-type]

    routes: list[BaseRoute] = [
        Route("/v1/chat/completions", endpoint(openai_frontend.OpenAIChatFrontend()),
              methods=["POST"]),
        Route("/v1/completions", endpoint(openai_frontend.OpenAICompletionsFrontend()),
              methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.services = services
    return app


class _Unstarted:
    """Stands in for the upstream client until the lifespan has made the real one."""

    async def send(self, req: object) -> upstream.UpstreamResponse:
        raise RuntimeError("the gateway's lifespan has not started")

    async def probe(self, url: str, timeout: float) -> int:
        return 0

    async def aclose(self) -> None:
        return None
