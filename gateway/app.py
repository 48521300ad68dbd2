"""The Starlette application: routes of every client protocol over one shared pipeline."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route

from adapters import registry
from gateway import cli, config, pipeline, routing, serving, supervisor, upstream

ClientFactory = Callable[[config.Config], upstream.UpstreamClient]


def aiohttp_client(cfg: config.Config) -> upstream.UpstreamClient:
    return upstream.AiohttpClient(cfg.server.timeouts.connect)


def build_app(cfg: config.Config, client_factory: ClientFactory = aiohttp_client) -> Starlette:
    """The gateway for `cfg`; `client_factory` makes the upstream client inside the loop."""
    router = routing.Router(cfg)
    services = serving.Services(cfg, router, pipeline.Pipeline(_Unstarted(), cfg.server),
                                keys=frozenset(cfg.server.api_keys))

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

    started = int(time.time())
    routes: list[BaseRoute] = [
        Route(path, serving.ProtocolEndpoint(make(), services), methods=["POST"])
        for path, make in registry.INFERENCE_ROUTES]
    routes += [
        Route(path, serving.StatusEndpoint(answer, services, cli.version(), started),
              methods=["GET"])
        for path, answer in registry.STATUS_ROUTES]
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
