"""From a canonical request to canonical events: pick an upstream, send, decode, retry.

The worker's status and first events are awaited before anything goes to the client, so an
early failure still gets a real status and may be retried on another upstream (tenacity,
bounded, jittered backoff, only `UpstreamUnavailable`). After that, events flow one batch per
upstream read; a stream that ends without its terminal event raises, and closing the iterator
(client gone) closes the upstream connection at once so the worker aborts.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import tenacity

from adapters import base
from gateway import config, routing, upstream
from schemas import canonical, errors
from schemas import events as ev


class AttemptObserver(Protocol):
    """Told of each upstream attempt (gateway.telemetry.Watch: metrics and spans)."""

    def begin(self, url: str) -> dict[str, str]:
        """An attempt on `url` starts; returns headers to send it (W3C trace context)."""
        ...

    def end(self, url: str, error: BaseException | None) -> None:
        """The attempt on `url` failed; its successful end is the request's end."""
        ...


@dataclass(slots=True)
class Attempt:
    """What a request did upstream, for its log line."""

    upstream: str | None = None
    attempts: int = 0
    status: int | None = None
    errors: list[str] = field(default_factory=list)
    observer: AttemptObserver | None = None


@dataclass(slots=True)
class Opened:
    """An upstream answer whose status is good and whose first events are in."""

    resp: upstream.UpstreamResponse
    decoder: base.StreamDecoder
    first: list[ev.Event]
    more: bool  # False once the body is fully read


class Pipeline:
    def __init__(self, client: upstream.UpstreamClient, server: config.ServerConfig):
        self.client = client
        self.timeouts = server.timeouts
        self.retries = server.retries

    async def open(self, route: routing.Route, req: canonical.InferenceRequest,
                   request_id: str, note: Attempt) -> Opened:
        """Send to the model's upstreams in turn until one answers with a first event."""
        order = route.upstreams.order()
        if not order:
            raise errors.UpstreamUnavailable(f"model `{route.name}` has no healthy upstream")
        try:  # the first attempt costs no retry machinery
            return await self._attempt(route, req, order, request_id, note)
        except errors.UpstreamUnavailable:
            if not self.retries:
                raise
        await asyncio.sleep(random.uniform(0, 0.05))  # jitter before the first retry, too
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.retries),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
            retry=tenacity.retry_if_exception_type(errors.UpstreamUnavailable),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(route, req, order, request_id, note)
        raise AssertionError("unreachable: tenacity reraises")

    async def _attempt(self, route: routing.Route, req: canonical.InferenceRequest,
                       order: list[str], request_id: str, note: Attempt) -> Opened:
        """One attempt, on the next upstream in `order`."""
        url = order[note.attempts % len(order)]
        note.attempts += 1
        note.upstream = url
        try:
            return await self._once(route, req, url, request_id, note)
        except errors.GatewayError as exc:
            note.errors.append(f"{url}: {exc.message}" + (f" ({exc.detail})" if exc.detail else ""))
            if note.observer is not None:
                note.observer.end(url, exc)
            raise

    async def _once(self, route: routing.Route, req: canonical.InferenceRequest, url: str,
                    request_id: str, note: Attempt) -> Opened:
        ureq = route.backend.build(req, base.Target(url, route.upstream_model, route.options))
        ureq.headers["x-request-id"] = request_id
        if note.observer is not None:
            ureq.headers.update(note.observer.begin(url))
        try:
            async with asyncio.timeout(self.timeouts.first_byte):
                resp = await self.client.send(ureq)
                note.status = resp.status
                try:
                    return await self._first(route, req, resp, ureq.streaming)
                except BaseException:
                    await resp.aclose()
                    raise
        except TimeoutError:
            raise errors.UpstreamTimeout(
                f"the worker sent nothing within {self.timeouts.first_byte:g}s") from None

    async def _first(self, route: routing.Route, req: canonical.InferenceRequest,
                     resp: upstream.UpstreamResponse, streaming: bool) -> Opened:
        if resp.status >= 400:
            raise route.backend.parse_error(resp.status, await resp.read())
        dec = route.decoder(req, streaming)
        if not streaming:
            dec.feed(await resp.read())
            return Opened(resp, dec, dec.close(), False)
        try:
            while data := await resp.read_chunk():
                if first := dec.feed(data):
                    return Opened(resp, dec, first, True)
        except errors.UpstreamBroken as exc:  # the transport broke before any event
            raise errors.UpstreamUnavailable(exc.message, detail=exc.detail) from exc
        return Opened(resp, dec, dec.close(), False)

    async def batches(self, opened: Opened) -> AsyncIterator[list[ev.Event]]:
        """Event batches, one per upstream read; the upstream is closed however this ends."""
        loop = asyncio.get_running_loop()
        dog = IdleWatchdog(loop, self.timeouts.idle)
        try:
            yield opened.first
            read = opened.resp.read_chunk
            while opened.more:
                dog.waiting = True
                try:
                    data = await read()
                except asyncio.CancelledError:
                    if dog.fired and dog.task is not None:
                        dog.task.uncancel()
                        raise errors.UpstreamTimeout(
                            f"the worker sent nothing for {self.timeouts.idle:g}s") from None
                    raise
                dog.waiting = False
                if not data:
                    if out := opened.decoder.close():
                        yield out
                    break
                dog.last = loop.time()
                if out := opened.decoder.feed(data):
                    yield out
        finally:
            dog.cancel()
            await asyncio.shield(opened.resp.aclose())


class IdleWatchdog:
    """Cancels the reading task when the worker is silent for `idle` seconds while awaited.

    Costs one float store per chunk, where an asyncio.timeout per read costs about 5 us.
    """

    __slots__ = ("_handle", "_idle", "_loop", "fired", "last", "task", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, idle: float):
        self._loop = loop
        self._idle = idle
        self.task = asyncio.current_task()
        self.last = loop.time()
        self.waiting = False
        self.fired = False
        self._handle = loop.call_at(self.last + idle, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if not self.waiting:
            self.last = max(self.last, now)
        due = self.last + self._idle
        if self.waiting and now >= due and self.task is not None:
            self.fired = True
            self.task.cancel()
        else:
            self._handle = self._loop.call_at(max(due, now + 0.001), self._check)

    def cancel(self) -> None:
        self._handle.cancel()
