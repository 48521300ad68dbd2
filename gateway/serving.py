"""One client request, end to end, as a plain ASGI endpoint per client protocol.

Body (bounded in size and time, decompressed) -> frontend.parse -> route -> backend.check ->
pipeline.open -> headers once the first events are in -> one send per upstream read -> end.
Every failure is rendered by the calling protocol's frontend: as a whole error response
before the first byte, in-band after it. A client that disconnects cancels the exchange, which
closes the upstream connection at once; so does a shutdown whose drain time ran out (the
client is told: a 503 or in-band)."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from adapters import base, registry
from gateway import (
    admission,
    config,
    content_encoding,
    deadline,
    exchange,
    folding,
    observability,
    peer,
    pipeline,
    routing,
    telemetry,
    tracing,
)
from gateway.http_cycle import new_id
from gateway.peer import Message, Receive, Scope, Send  # ASGI's, as gateway.peer spells them
from schemas import canonical, errors
from schemas import events as ev

Exchange = exchange.Exchange

# What a request still under way is told when the server's drain time runs out (SIGTERM).
SHUTTING_DOWN = "the gateway is shutting down; retry the request"
# RFC 9110 section 11.6.1: a 401 MUST carry a challenge; one for each scheme `check_key` takes
# on every route. Schemes are case-insensitive (11.1); spelled as RFC 6750 spells Bearer and as
# Elasticsearch's security plugin spells ApiKey in its own 401s (x-pack Security.java).
_SPELLING = {"bearer": "Bearer", "apikey": "ApiKey"}
CHALLENGE = ", ".join(_SPELLING.get(s, s) for s in sorted(registry.AUTH_SCHEMES, reverse=True))


@dataclass
class Services:
    """What every endpoint shares: settings, routes, the pipeline, the in-flight count."""

    config: config.Config
    router: routing.Router
    pipeline: pipeline.Pipeline
    admission: admission.Admission  # server.max_concurrent_requests, over every process
    keys: tuple[bytes, ...] = ()  # server.api_keys as UTF-8 (gateway.serving.check_key)
    tracing: tracing.Tracing | None = None


class ProtocolEndpoint:
    """An ASGI app serving one client protocol's inference route."""

    def __init__(self, frontend: base.Frontend, services: Services, route: str = ""):
        self.frontend = frontend
        self.services = services
        self.route = route  # the route's template: the metrics' and spans' `http.route`
        self.max_body = services.config.server.max_request_bytes  # read once
        self.echoed = registry.echoed(type(frontend))  # the protocol's, e.g. X-Opaque-Id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.serve(peer.AsgiPeer(scope, receive, send))

    async def serve(self, client: peer.Peer) -> None:
        """The request of `client`, answered (the native server calls this directly)."""
        headers = client.headers
        rid = headers.get("x-request-id") or new_id()
        x = Exchange(rid, client.path, time.perf_counter())
        x.route, s = self.route, self.services  # a store: a keyword argument builds a dict
        x.watch = x.note.observer = telemetry.Watch(s.tracing, headers, self.route)
        if self.echoed:
            x.echoed = echoes(self.echoed, headers)
        admitted = False
        # Who renders an error: the frontend until the body parsed, then that request's
        # translator (which knows the request's schema and framing).
        answerer: base.Frontend | base.Translator = self.frontend
        send = client.send
        failure: errors.GatewayError | None = None
        cut: asyncio.CancelledError | None = None
        try:
            try:
                check_key(s.keys, headers)
                if not s.admission.enter():
                    raise errors.Overloaded("too many requests in flight; retry later")
                admitted = True
                body = client.ready_body(self.max_body) or \
                    await read_body(client.receive, headers, s.config.server)
                if "content-encoding" in headers:
                    body = content_encoding.decoded(body, headers["content-encoding"],
                                                    self.max_body)
                ctx = base.RequestContext(client.path, client.path_params, headers,
                                          s.router.options)
                answerer = translator = self.frontend.parse(body, ctx)
                await self._watched(self._exchange(translator, x, client), client, x)
            except errors.GatewayError as exc:
                failure = exc
            except ClientGone:  # before its body ended: nobody to answer, nothing sent upstream
                x.outcome = x.error_type = "client_closed"
            except asyncio.CancelledError as exc:  # the server's drain ran out (gateway.listener)
                failure, cut = errors.UpstreamUnavailable(SHUTTING_DOWN), exc
            except Exception as exc:  # a bug: logged with its traceback, answered cleanly
                observability.log_bug(rid, exc)
                x.error_type = "internal"
                failure = errors.GatewayError("internal gateway error")
            # Answered after the handlers, not in them: nothing here waits while handling an
            # exception (setup.py: a compiled coroutine would leave it to the loop meanwhile).
            if failure is not None:
                await self._fail(failure, x, send, answerer)
                failure = None  # its traceback holds this frame: no cycle left to the collector
            if cut is not None:
                x.outcome = "shutdown"
                raise cut
        finally:
            if admitted:
                s.admission.leave()
            observability.log_exchange(x)

    async def _watched(self, work: Awaitable[None], client: peer.Peer, x: Exchange) -> None:
        """Run `work`; if the client disconnects first, cancel it (which closes the upstream)."""
        task = asyncio.current_task()
        assert task is not None

        def gone() -> None:
            if not x.finishing:
                x.outcome = x.error_type = "client_closed"
                task.cancel()

        stop = client.on_disconnect(gone)
        try:
            await work
        except asyncio.CancelledError:
            if x.outcome != "client_closed":
                raise
            task.uncancel()
        finally:
            stop()

    async def _exchange(self, t: base.Translator, x: Exchange, client: peer.Peer) -> None:
        s = self.services
        req = t.request
        route = s.router.resolve(req.model)
        x.model, x.stream = route.name, req.stream
        if x.watch is not None:
            x.watch.route(route, req)
        route.backend.check(req)
        meta = base.ResponseMeta(new_id(), int(time.time()), req.model or route.name,
                                 x.request_id, route.options)
        x.response_id = meta.id
        opened = await s.pipeline.open(route, req, x.request_id, x.note)
        x.first_event_at = time.perf_counter()
        ended: BaseException | None = None
        try:
            if req.stream:
                await self._stream(t, meta, opened, x, client)
            else:
                await self._whole(t, meta, opened, x, client.send, route)
        except BaseException as exc:  # held, not handled: closing may wait (as in `serve`)
            ended = exc
        # however it ended: the upstream closed, its in-flight count ended
        await opened.close(route.upstreams)
        if ended is not None:
            try:
                raise ended
            finally:
                ended = None  # no cycle through this frame

    async def _stream(self, t: base.Translator, meta: base.ResponseMeta,
                      opened: pipeline.Opened, x: Exchange, client: peer.Peer) -> None:
        """Each batch encoded and written as it comes: by the client's `write_body` without
        an await where it has one (the gateway's own server; the pipeline may then run this
        in the worker connection's callback), else one ASGI send per batch."""
        enc = t.encoder(meta)
        head = _start(200, enc.media_type, {"cache-control": "no-cache", **enc.headers}, x)
        await client.send(head)
        reasons: list[str] = []  # each choice's finish, as it comes
        write: Callable[[bytes], bool] | None = getattr(client, "write_body", None)
        pending: list[bytes] = []  # ASGI: what the next send carries
        holds = getattr(enc, "holds_back", True)  # base.StreamEncoder.flush
        encode = enc.encode  # bound once: a method lookup less an event

        def note(e: ev.Event) -> None:
            if isinstance(e, ev.Finish):
                reasons.append(e.reason)
            elif isinstance(e, ev.Usage):
                x.usage = e

        def emit(batch: list[ev.Event]) -> bool:
            # a paced stream's read is one event: no comprehension (a frame in 3.11) and join
            out = encode(batch[0]) if len(batch) == 1 else b"".join([encode(e) for e in batch])
            for e in batch:  # nothing of a batch is kept past it (cold by a paced stream's
                if not isinstance(e, ev.TextDelta):  # next read); a text delta needs no note
                    note(e)
            if holds:
                out += enc.flush()
            if not out:
                return True
            if write is not None:
                return write(out)
            pending.append(out)
            return False

        async def drain() -> None:
            if write is None:
                out = b"".join(pending)
                pending.clear()
                await client.send({"type": "http.response.body", "body": out,
                                   "more_body": True})
            else:
                await client.drain()  # type: ignore[attr-defined]

        cut: asyncio.CancelledError | None = None
        try:
            await self.services.pipeline.stream(opened, emit, drain)
            tail = enc.finish()
            x.finish_reasons = reasons
        except (Exception, asyncio.CancelledError) as exc:  # in-band, never a quiet cut
            if isinstance(exc, asyncio.CancelledError):
                if x.outcome == "client_closed":
                    raise
                cut = exc  # the server's drain ran out: told, then cancelled all the same
            tail = enc.fail(ended_by(exc, x))
        x.finishing = True
        await client.send({"type": "http.response.body", "body": b"".join([*pending, tail]),
                           "more_body": False})
        if cut is not None:
            raise cut

    async def _whole(self, t: base.Translator, meta: base.ResponseMeta,
                     opened: pipeline.Opened, x: Exchange, send: Send,
                     route: routing.Route) -> None:
        req = t.request  # `per_token`: each chunk of a folded stream keeps its token
        if opened.more:  # a whole answer asked of a worker that streamed it (gateway.whole)
            done = await folding.folded(self.services.pipeline, route, opened, req, x.request_id,
                                        x.note)
        else:
            done = canonical.Completion.fold(opened.first, req.choice_count, req.per_token)
        x.usage = done.usage
        x.finish_reasons = [c.finish.reason for c in done.choices if c.finish is not None]
        out = t.render(done, meta)
        await self._whole_response(out, x, send)

    async def _whole_response(self, out: base.Rendered, x: Exchange, send: Send) -> None:
        await send(_start(out.status, out.media_type, out.headers, x))
        x.finishing = True
        await send({"type": "http.response.body", "body": out.body, "more_body": False})

    async def _fail(self, exc: errors.GatewayError, x: Exchange, send: Send,
                    answerer: base.Frontend | base.Translator) -> None:
        x.error = logged(exc)
        x.error_type = x.error_type or telemetry.error_type(exc)
        if x.outcome == "ok":
            x.outcome = "client_error" if callers(exc) else "error"
        if x.head_sent:
            return
        out = answerer.render_error(exc)
        if isinstance(exc, errors.Unauthorized):
            out = unauthorized(out)
        try:
            await self._whole_response(out, x, send)
        except OSError:  # the client is gone; nothing left to tell it
            x.outcome = x.error_type = "client_closed"


def _start(status: int, media_type: str, extra: dict[str, str], x: Exchange) -> Message:
    """The answer's `http.response.start`: the client's id as it sent it (its bytes were read
    as latin-1, gateway.http_cycle)."""
    hdrs = [(b"content-type", media_type.encode()),
            (b"x-request-id", x.request_id.encode("latin-1"))]
    if extra:
        hdrs += [(k.encode(), v.encode()) for k, v in extra.items()]
    if x.echoed:
        hdrs += x.echoed
    x.status, x.head_sent = status, True
    return {"type": "http.response.start", "status": status, "headers": hdrs}


def echoes(names: tuple[str, ...], headers: dict[str, str]) -> tuple[tuple[bytes, bytes], ...]:
    """Each of `names` the request carries, as the client sent it (latin-1, gateway.http_cycle),
    for its answer to carry back (registry.echoed)."""
    return tuple((n.encode(), headers[n].encode("latin-1")) for n in names if n in headers)


def callers(exc: errors.GatewayError) -> bool:
    """The request's own fault: the gateway refused it, or the worker did with a 4xx (its
    `max_tokens` past the context, say), which the client gets as a 4xx too."""
    return isinstance(exc, errors.RequestError) or (
        isinstance(exc, errors.UpstreamRejected) and exc.status < 500)


def ended_by(exc: BaseException, x: Exchange) -> errors.GatewayError:
    """What ended a stream after its first byte, as the in-band error it is told with; the
    exchange notes it for the log line."""
    if isinstance(exc, errors.GatewayError):
        x.error, x.outcome, x.error_type = logged(exc), "upstream_error", telemetry.error_type(exc)
        return exc
    if isinstance(exc, asyncio.CancelledError):
        x.error, x.outcome, x.error_type = SHUTTING_DOWN, "shutdown", "shutdown"
        return errors.UpstreamUnavailable(SHUTTING_DOWN)
    observability.log_bug(x.request_id, exc)
    x.error, x.outcome, x.error_type = str(exc), "bug", "internal"
    return errors.GatewayError("internal gateway error")


def unauthorized(out: base.Rendered) -> base.Rendered:
    """A 401 with its `WWW-Authenticate` challenge (each route takes every scheme)."""
    return dataclasses.replace(out, headers={**out.headers, "www-authenticate": CHALLENGE})


def logged(exc: errors.GatewayError) -> str:
    """An error as the request's log line tells it: the client's message and the detail that
    only the log gets (the worker's address, an exception's class, a body)."""
    return f"{exc.message} ({exc.detail})" if exc.detail else exc.message


class ClientGone(Exception):
    """The client closed its connection before its request body ended."""


async def read_body(receive: Receive, headers: dict[str, str], server: config.ServerConfig) -> bytes:
    """The whole request body, refused past `max_request_bytes` or `timeouts.request_read`;
    ClientGone if the client leaves first."""
    limit = server.max_request_bytes
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise errors.PayloadTooLarge(f"the request body exceeds {limit} bytes")
    parts: list[bytes] = []
    size = 0
    try:
        with deadline.Deadline(server.timeouts.request_read):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise errors.PayloadTooLarge(f"the request body exceeds {limit} bytes")
                parts.append(chunk)
                if not message.get("more_body", False):
                    return parts[0] if len(parts) == 1 else b"".join(parts)
    except TimeoutError:
        raise errors.InvalidRequest(
            f"the request body did not arrive within {server.timeouts.request_read:g}s",
            status=408) from None


def check_key(keys: tuple[bytes, ...], headers: dict[str, str]) -> None:
    """`Authorization: <scheme> K` (registry.AUTH_SCHEMES) or `x-api-key: K`, when keys are
    set: each key compared with both in constant time, no early exit (timing tells nothing of
    a guess); latin-1 gives back the client's bytes (gateway.http_cycle). No key is empty."""
    if not keys:
        return
    scheme, _, token = headers.get("authorization", "").partition(" ")
    bearer = token.strip() if scheme.lower() in registry.AUTH_SCHEMES else ""
    given = (bearer.encode("latin-1", "replace"),
             headers.get("x-api-key", "").encode("latin-1", "replace"))
    found = False
    for key in keys:
        found |= hmac.compare_digest(given[0], key)
        found |= hmac.compare_digest(given[1], key)
    if not found:
        raise errors.Unauthorized("a valid API key is required")
