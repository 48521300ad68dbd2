"""The Starlette application: routes of every client protocol over one shared pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from adapters import registry
from gateway import (
    admission,
    board,
    config,
    exchange,
    health,
    hooks,
    http1,
    http_cycle,
    metrics,
    observability,
    pipeline,
    resolver,
    routing,
    serving,
    status_routes,
    supervisor,
    tracing,
    upstream,
    version,
)
from schemas import errors

# How often DNS-named upstreams (headless Services) are re-resolved.
DNS_REFRESH_SECONDS = 5.0

ClientFactory = Callable[[config.Config], upstream.UpstreamClient]


def http1_client(cfg: config.Config) -> upstream.UpstreamClient:
    return http1.Http1Client(cfg.server.timeouts.connect)


def build_app(cfg: config.Config, client_factory: ClientFactory = http1_client,
              traces: tracing.Tracing | None = None, manage_workers: bool = True,
              shared: str | None = None, slot: int = 0) -> FastPaths:
    """The gateway for `cfg`; `client_factory` makes the upstream client inside the loop;
    `traces` (gateway.tracing) gives every request a span. `manage_workers=False` (a serving
    process of several): the managed workers are run by the parent process, and this one only
    gates them into rotation by their health; `shared` is then the directory where the
    processes share their upstreams' standing (gateway.board) and their in-flight counts,
    this one's in `slot` (gateway.admission)."""
    router = routing.Router(cfg, hooks.Events(), board.Board(shared) if shared else None)
    flow = pipeline.Pipeline(_Unstarted(), cfg.server)
    flow.on_failover = hooks.failover
    admitted = admission.Admission(cfg.server.max_concurrent_requests, shared, slot)
    services = serving.Services(cfg, router, flow, admitted,
                                keys=tuple(k.encode() for k in cfg.server.api_keys), tracing=traces)
    metrics.declare(router)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client = client_factory(cfg)
        services.pipeline.client = client
        workers = supervisor.Supervisor(cfg, router, client)
        app.state.supervisor = workers
        sets = [r.upstreams for r in router.routes.values() if r.upstreams.to_resolve]
        dns = asyncio.ensure_future(resolver.refresh_forever(sets, DNS_REFRESH_SECONDS))
        watchers = health.start(router.routes.values(), client, cfg.server.health)
        try:
            await workers.start(manage=manage_workers)
            gc.collect()
            gc.freeze()  # what startup made lives for good; keep it out of every collection
            observability.logger().info("ready", upstreams={
                r.name: len(r.upstreams.all) for r in router.routes.values()})
            yield
        finally:
            dns.cancel()
            for w in watchers:
                w.cancel()
            await workers.stop()
            await client.aclose()
            if traces is not None:
                traces.shutdown()
            metrics.flush()  # the last turn's, into the files other processes' scrapes read
            observability.logger().info("stop")

    started = int(time.time())
    routes: list[BaseRoute] = [
        Route(path, serving.ProtocolEndpoint(make(), services, path), methods=["POST"])
        for path, make in registry.INFERENCE_ROUTES]
    routes += [
        Route(path, status_routes.StatusEndpoint(answer, services, version.version(), started,
                                                 registry.STATUS_ERRORS[path]().render_error,
                                                 registry.STATUS_ECHOED[path]),
              methods=["GET"])
        for path, answer in registry.STATUS_ROUTES]
    async def metrics_route(scope: Scope, receive: Receive, send: Send) -> None:
        # every answer carries the request's id, the client's or a new one, and has its one
        # log line (SPEC.md)
        rid = dict(scope["headers"]).get(b"x-request-id") or http_cycle.new_id().encode()
        x = exchange.Exchange(rid.decode("latin-1"), "/metrics", time.perf_counter())
        try:
            body = metrics.exposition(router)
            x.status = 200
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", metrics.CONTENT_TYPE.encode()),
                                    (b"x-request-id", rid)]})
            await send({"type": "http.response.body", "body": body})
        finally:
            observability.log_exchange(x)

    routes.append(Route("/metrics", _Asgi(metrics_route), methods=["GET"]))
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={404: no_route, 405: no_route})
    app.router.redirect_slashes = False  # no_route redirects, without the client's Host
    app.state.services = services
    return FastPaths(app, routes, lifespan, cfg.server.cors)


async def no_route(request: Request, exc: Exception) -> Response:
    """Starlette's 404 and 405, in the error body of the protocol the path belongs to (an
    OpenAI client that posts to `/v1/chat/completion` reads an OpenAI error object); plain
    text for a path under no protocol's prefix."""
    assert isinstance(exc, HTTPException)
    extra = dict(exc.headers or {})  # a 405's Allow
    rid = extra["x-request-id"] = request.headers.get("x-request-id") or http_cycle.new_id()
    for name in registry.echoed(registry.errors_for(request.url.path)):  # X-Opaque-Id
        if name in request.headers:
            extra[name] = request.headers[name]
    x = exchange.Exchange(rid, request.url.path, time.perf_counter())
    try:  # its one line (SPEC.md), as an endpoint's: a client's base URL one letter off
        return _no_route(request, exc, extra, x)
    finally:
        observability.log_exchange(x)


def _no_route(request: Request, exc: HTTPException, extra: dict[str, str],
              x: exchange.Exchange) -> Response:
    x.status = exc.status_code
    if exc.status_code == 404 and (twin := _slash_twin(request)) is not None:
        x.status = 307
        return Response(status_code=307, headers={**extra, "location": twin})
    x.outcome, x.error = "client_error", str(exc.detail)
    x.error_type = "MethodNotAllowed" if exc.status_code == 405 else "NoRoute"
    make = registry.errors_for(request.url.path)
    if make is None:
        return PlainTextResponse(exc.detail, exc.status_code, headers=extra)
    method, path = request.method, request.url.path
    uri = path + (f"?{request.url.query}" if request.url.query else "")
    refusal: errors.NoRoute
    if exc.status_code == 405:
        allowed = extra["Allow"] = _allowed(request) or extra.get("Allow", "")
        refusal = errors.MethodNotAllowed(
            f"Method {method} is not allowed for {path} (allowed: {allowed})",
            method=method, uri=uri, allowed=allowed)
    else:
        refusal = errors.NoRoute(f"Unknown request URL: {method} {path}", method=method,
                                 uri=uri)
    out = make().render_error(refusal)
    x.status, x.error = out.status, refusal.message
    return Response(out.body, out.status, headers={**out.headers, **extra},
                    media_type=out.media_type)


# The order `Allow` lists methods in (a set has none of its own).
_METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed(request: Request) -> str:
    """Every method some route at the request's path takes: RFC 9110 section 15.5.6 has a 405's
    `Allow` list the target resource's methods, and Starlette's names only the first route's
    (TGI's `/` and Elasticsearch's `_inference/{id}` each have a GET route and a POST one)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods \
                and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    known = [m for m in _METHOD_ORDER if m in methods]
    return ", ".join(known + sorted(methods.difference(known)))


def _slash_twin(request: Request) -> str | None:
    """The path with its trailing slash dropped or added when a route takes that one instead,
    as Starlette's redirect_slashes finds it, but as a relative reference (RFC 9110 section
    10.2.2): Starlette builds an absolute URL from the client's Host header, so any Host
    (`evil.example`) came back as the redirect's target."""
    path = request.scope["path"]
    twin = path.rstrip("/") if path.endswith("/") else path + "/"
    if not twin or twin == path:
        return None
    scope = {**request.scope, "path": twin}
    if not any(r.matches(scope)[0] != Match.NONE for r in request.app.router.routes):
        return None
    query = request.scope.get("query_string", b"").decode("latin-1")
    return urllib.parse.quote(twin) + (f"?{query}" if query else "")


class FastPaths:
    """Sends requests for fixed paths straight to their endpoint, skipping Starlette's router
    and its middleware wrappers on every `send` (the benchmark's profile showed them on each
    streamed chunk); path-parameter routes, HEAD, 404/405 and lifespan go through Starlette.
    `native`: the fixed routes' endpoints as the gateway's own server calls them (with the
    request itself, gateway.peer.Peer, not an ASGI scope); `lifespan()`: the app's startup and
    shutdown, for that server."""

    def __init__(self, app: Starlette, routes: list[BaseRoute],
                 lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]],
                 cors: config.CorsConfig | None = None):
        """`cors`: server.cors; on the ASGI path Starlette's CORSMiddleware answers with it
        around every route (the gateway's own server: gateway.cors, held to the same answers)."""
        self.starlette = app
        self._lifespan = lifespan
        self._entry: ASGIApp = self.dispatch
        if cors is not None and cors.enabled:
            self._entry = CORSMiddleware(
                self.dispatch, allow_origins=cors.allow_origins,
                allow_methods=cors.allow_methods, allow_headers=cors.allow_headers,
                allow_credentials=cors.allow_credentials,
                allow_origin_regex=cors.allow_origin_regex,
                allow_private_network=cors.allow_private_network,
                expose_headers=cors.expose_headers, max_age=cors.max_age)
        self.exact: dict[tuple[str, str], ASGIApp] = {}
        self.native: dict[tuple[str, str], Callable[[Any], Awaitable[None]]] = {}
        for r in routes:
            if isinstance(r, Route) and "{" not in r.path:
                for method in r.methods or ():
                    if method != "HEAD":
                        self.exact[(method, r.path)] = r.endpoint
                        serve = getattr(r.endpoint, "serve", None)
                        if serve is not None:
                            self.native[(method, r.path)] = serve

    def lifespan(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._lifespan(self.starlette)

    def match(self, method: str, path: str) -> tuple[Callable[[Any], Awaitable[None]],
                                                     dict[str, Any]] | None:
        """The native endpoint and path parameters of a path-parameter route (Starlette's own
        matching, first full match in route order); None where Starlette should answer (no
        route, a method the route does not take, an endpoint with no native form). A slash
        that came percent-encoded (http_cycle.routing_path) is a `/` in its parameter."""
        scope = {"type": "http", "path": path, "method": method}
        for route in self.starlette.router.routes:
            found, child = route.matches(scope)
            if found is Match.FULL:
                serve = getattr(child.get("endpoint"), "serve", None)
                if serve is None:
                    return None
                params = child["path_params"]
                if http_cycle.ENCODED_SLASH in path:
                    params = {k: v.replace(http_cycle.ENCODED_SLASH, "/") if isinstance(v, str)
                              else v for k, v in params.items()}
                return serve, params
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._entry(scope, receive, send)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app without CORS: what the gateway's own server calls (it answers CORS itself,
        gateway.cors)."""
        if scope["type"] == "http":
            endpoint = self.exact.get((scope["method"], scope["path"]))
            if endpoint is not None:
                return await endpoint(scope, receive, send)
        await self.starlette(scope, receive, send)

    def __getattr__(self, name: str) -> Any:  # state, router: the Starlette app's
        return getattr(self.starlette, name)


class _Asgi:
    """Wraps an ASGI function so Starlette treats it as an app, not a request handler."""

    def __init__(self, fn: ASGIApp):
        self.fn = fn

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.fn(scope, receive, send)


class _Unstarted:
    """Stands in for the upstream client until the lifespan has made the real one."""

    async def send(self, req: object) -> upstream.UpstreamResponse:
        raise RuntimeError("the gateway's lifespan has not started")

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        return 0, "the gateway's lifespan has not started"

    async def aclose(self) -> None:
        return None
