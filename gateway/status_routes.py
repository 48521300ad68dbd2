"""The status routes (health, model lists, info): answered from a snapshot of the gateway, in
the error body of the route's protocol, with each request's id and log line."""

from __future__ import annotations

import time
from collections.abc import Callable

from adapters import base, registry
from gateway import exchange, http_cycle, observability, peer, serving, telemetry
from gateway.peer import Receive, Scope, Send  # ASGI's, as gateway.peer spells them
from schemas import errors


class StatusEndpoint:
    """An ASGI app answering a status route (health, model list, info) from a snapshot."""

    def __init__(self, answer: base.StatusRoute, services: serving.Services, version: str,
                 started: int, render_error: Callable[[errors.GatewayError], base.Rendered],
                 echoed: tuple[str, ...] = ()):
        self.answer = answer
        self.echoed = echoed  # registry.STATUS_ECHOED
        self.render_error = render_error  # the route's protocol's error body
        self.services = services
        self.version = version
        self.started = started

    def view(self) -> base.GatewayView:
        s = self.services
        models = tuple(
            base.ModelView(r.name, r.config.aliases, r.upstream_model,
                           bool(r.upstreams.in_rotation()), r.options)
            for r in s.router.routes.values())
        default = s.router.default
        return base.GatewayView(
            models, next((m for m in models if default and m.name == default.name), None),
            self.version, self.started, s.config.server.max_concurrent_requests,
            s.config.server.max_request_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.serve(peer.AsgiPeer(scope, receive, send))

    async def serve(self, client: peer.Peer) -> None:
        headers = client.headers
        rid = headers.get("x-request-id") or http_cycle.new_id()  # every answer has one (SPEC.md)
        # and one log line, as vLLM's access log has one for each probe and scrape
        x = exchange.Exchange(rid, client.path, time.perf_counter())
        ctx = base.RequestContext(client.path, client.path_params, headers,
                                  self.services.router.options)
        try:
            if _guarded(client.path):
                serving.check_key(self.services.keys, headers)
            out = self.answer(self.view(), ctx)
        except errors.GatewayError as exc:
            out = self.render_error(exc)
            if isinstance(exc, errors.Unauthorized):
                out = serving.unauthorized(out)
            x.outcome = "client_error" if serving.callers(exc) else "error"
            x.error, x.error_type = serving.logged(exc), telemetry.error_type(exc)
        except Exception as exc:  # a bug: logged, answered cleanly
            observability.log_bug(rid, exc)
            out = self.render_error(errors.GatewayError("internal gateway error"))
            x.outcome, x.error_type = "bug", type(exc).__name__
        x.status = out.status
        # no media type: no content-type at all (TGI's healthy /health is `()`)
        hdrs = [(b"content-type", out.media_type.encode())] if out.media_type else []
        hdrs += [(k.encode(), v.encode()) for k, v in out.headers.items()]
        hdrs.append((b"x-request-id", rid.encode("latin-1")))
        if self.echoed:
            hdrs += serving.echoes(self.echoed, headers)
        try:
            await client.send({"type": "http.response.start", "status": out.status,
                               "headers": hdrs})
            await client.send({"type": "http.response.body", "body": out.body})
        finally:
            observability.log_exchange(x)


def _guarded(path: str) -> bool:
    """Health checks and metrics stay open when API keys are set (SPEC.md, server.api_keys)."""
    return path not in registry.OPEN_STATUS_ROUTES and path != "/metrics"
