"""From a canonical request to canonical events: pick an upstream, send, decode, retry.

The worker's status and first events are awaited before anything goes to the client, so an
early failure still gets a real status and may be retried on another upstream (tenacity,
bounded, jittered backoff; which failures: `upstream.retriable`). After that, events flow one
batch per upstream read; a stream that ends without its terminal event raises, and closing
the iterator (client gone) closes the upstream connection at once so the worker aborts.

Every attempt is accounted to its upstream (in flight while it runs; a worker failure counts
toward ejection, a 4xx never does). A stream whose worker fails after the first byte is
continued on other workers (`server.failover_attempts`, gateway.failover) when the backend
can build the continuation: the client keeps one stream. A whole answer that may be long is
asked as a stream too, and its body-only form gets a deadline for its decode (gateway.whole)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import tenacity

from adapters import base
from gateway import affinity, balancer, config, deadline, failover, pump, routing, upstream, whole
from gateway.progress import Progress, choices, resumable
from schemas import canonical, errors
from schemas import events as ev


class AttemptObserver(Protocol):
    """Told of each upstream attempt (gateway.telemetry.Watch: metrics and spans)."""

    def begin(self, url: str, ticket: int | None) -> dict[str, str]:
        """An attempt on `url` starts (`ticket`: its own, from balancer.Upstreams.begin);
        returns headers to send it (W3C trace context)."""

    def end(self, ticket: int | None, error: BaseException | None) -> None:
        """The attempt of `ticket` failed; its successful end is the request's end."""

    def failing_over(self) -> None:
        """The next attempt continues a stream cut after its first byte: a failover, which
        is counted as one, not as a retry."""


@dataclass(slots=True)
class Attempt:
    """What a request did upstream, for its log line."""

    upstream: str | None = None
    attempts: int = 0
    status: int | None = None
    errors: list[str] = field(default_factory=list)
    failovers: int = 0
    observer: AttemptObserver | None = None


@dataclass(slots=True)
class Opened:
    """An upstream answer whose status is good and whose first events are in."""

    resp: upstream.UpstreamResponse
    decoder: base.StreamDecoder
    first: list[ev.Event]
    more: bool  # False once the body is fully read
    url: str = ""
    job: Job | None = None  # what a failover needs to ask another worker
    released: bool = False
    ticket: int | None = None  # its attempt's, from balancer.Upstreams.begin

    async def close(self, upstreams: balancer.Upstreams | None) -> None:
        """Close the answer and end its upstream's in-flight count, once."""
        if not self.released:
            self.released = True
            if upstreams is not None:
                upstreams.end(self.url, self.ticket)
            close_now = getattr(self.resp, "close_now", None)  # gateway.http1: never waits
            if close_now is not None:
                close_now()
            else:
                await asyncio.shield(self.resp.aclose())


@dataclass(slots=True)
class Job:
    """One request's route and canonical form, kept for a continuation."""

    route: routing.Route
    req: canonical.InferenceRequest
    request_id: str
    note: Attempt
    tries: int = 0  # attempts of this open(): the index into its order
    wait: float = 0.0  # a non-streaming worker request's deadline (gateway.whole)

    def pick(self, order: list[str]) -> int:
        """The next attempt's index into `order`, past its end once it comes round: a retry
        passes over those ejected or half-open since; none left, the turn's (panic)."""
        i, n = self.tries, len(order)
        if i:
            usable = self.route.upstreams.usable
            i = next((j for j in range(i, i + n) if usable(order[j % n])), i)
        return i

    def fresh(self, order: list[str]) -> bool:  # the next attempt's upstream is not yet tried
        return self.pick(order) < len(order)

    def next(self, order: list[str]) -> str:  # the next attempt's upstream, taken
        i = self.pick(order)
        self.tries = i + 1
        return order[i % len(order)]


class Pipeline:
    def __init__(self, client: upstream.UpstreamClient, server: config.ServerConfig):
        self.client = client
        self.timeouts = server.timeouts
        # read once, as gateway.routing.Route's names (a pydantic read goes through a hook)
        self.first_byte, self.idle = self.timeouts.first_byte, self.timeouts.idle
        self.retries = server.retries
        self.failover_attempts = server.failover_attempts
        # (request id, model, failed upstream, the one continuing or None, tokens): gateway.hooks
        self.on_failover: Callable[[str, str, str, str | None, int], None] = lambda *_: None

    async def open(self, route: routing.Route, req: canonical.InferenceRequest,
                   request_id: str, note: Attempt, avoid: str | None = None) -> Opened:
        """Send to the model's upstreams in turn until one answers with a first event."""
        ups = route.upstreams
        order = ups.order(affinity.prefix_key(req) if ups.policy == "prefix" else None)
        if avoid is not None:
            # A continuation goes to another worker only (SPEC.md): the one that failed may be
            # dead, and a worker that cannot continue its own answer would repeat it.
            order = [u for u in order if u != avoid]
        if not order:
            raise errors.UpstreamUnavailable(f"model `{route.name}` has no healthy upstream")
        wait = self.first_byte
        if not req.stream:  # a long one is asked as a stream, and folded (gateway.whole)
            req, wait = whole.plan(route.backend, req, self.timeouts, route.vocab is not None)
        job = Job(route, req, request_id, note, 0, wait)  # positional: no keywords' dict
        try:  # the first attempt costs no retry machinery
            return await self._attempt(job, order)
        except (errors.UpstreamUnavailable, errors.UpstreamTimeout) as exc:
            if not self.retries or not upstream.retriable(exc, job.fresh(order)):
                raise
        await asyncio.sleep(random.uniform(0, 0.05))  # jitter before the first retry, too
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.retries),
            wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
            retry=tenacity.retry_if_exception(lambda e: upstream.retriable(e, job.fresh(order))),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(job, order)
        raise AssertionError("unreachable: tenacity reraises")

    async def _attempt(self, job: Job, order: list[str]) -> Opened:
        """One attempt, on the next upstream in `order`, accounted to that upstream."""
        note, ups = job.note, job.route.upstreams
        url = job.next(order)
        # Built before the attempt begins: the gateway's own refusal (a chat the template
        # cannot render) is no attempt and judges no upstream (as the worker's answer, it
        # restored a half-open one untried and broke a dead one's run of failures).
        ureq = self._request(job, url)
        note.attempts += 1
        note.upstream = upstream.shown(url)  # the log line's: no password
        ticket = ups.begin(url)
        try:
            opened = await self._once(job, url, ureq, ticket)
        except BaseException as exc:
            ups.end(url, ticket)
            if isinstance(exc, errors.UpstreamError) and not 400 <= exc.status < 500:
                ups.failed(url, ticket)
            elif isinstance(exc, errors.GatewayError):
                # it answered (what the gateway refuses itself never gets here): a 4xx never
                # counts toward ejection (SPEC.md), not even an overloaded worker's 429 that
                # another worker is asked instead (as Envoy's consecutive_5xx, reset by any)
                ups.succeeded(url, ticket)
            if isinstance(exc, errors.GatewayError):
                note.errors.append(_failure(url, exc))
                if note.observer is not None:
                    note.observer.end(ticket, exc)
            raise
        if not opened.more:  # a stream is judged at its end (a break after the first byte
            ups.succeeded(url, ticket)  # counts toward ejection too)
        opened.url, opened.job, opened.ticket = url, job, ticket
        return opened

    @staticmethod
    def _request(job: Job, url: str) -> base.UpstreamRequest:
        route = job.route
        ureq = route.backend.build(job.req, base.Target(url, route.upstream_model,
                                                        route.options))
        ureq.headers["x-request-id"] = job.request_id
        if (host := route.upstreams.hosts.get(url)) is not None:
            ureq.headers["host"] = host  # an address its DNS name stands for: the name's Host
        return ureq

    async def _once(self, job: Job, url: str, ureq: base.UpstreamRequest,
                    ticket: int) -> Opened:
        route, req, note = job.route, job.req, job.note
        if note.observer is not None:
            ureq.headers.update(note.observer.begin(url, ticket))
        # A stream's first byte comes after queueing and prefill; a body's after its whole
        # generation, which gateway.whole bounds.
        wait = self.first_byte if ureq.streaming else job.wait
        try:
            with deadline.Deadline(wait):
                resp = await self.client.send(ureq)
                note.status = resp.status
                try:
                    return await self._first(route, req, resp, ureq.streaming)
                except BaseException:
                    await resp.aclose()
                    raise
        except TimeoutError:
            raise errors.UpstreamTimeout(f"the worker sent nothing within {wait:g}s") from None

    async def _first(self, route: routing.Route, req: canonical.InferenceRequest,
                     resp: upstream.UpstreamResponse, streaming: bool) -> Opened:
        if resp.status >= 400:
            raise await upstream.refusal(route.backend, resp)
        dec = route.decoder(req, streaming)
        try:
            if not streaming:  # one body: all of it is before the client's first byte
                dec.feed(await resp.read())
                return Opened(resp, dec, dec.close(), False)
            while data := await resp.read_chunk():
                if first := dec.feed(data):
                    return Opened(resp, dec, first, True)
            # An answer that ended before its first event fails the same way, whether its
            # bytes failed on a read or at the end, streamed or one body: e.g. trtllm-serve's
            # `null` with HTTP 200 when its executor fails (openai_server.py openai_chat:
            # CppExecutorError), a connection reset inside a body.
            return Opened(resp, dec, dec.close(), False)
        except errors.UpstreamBroken as exc:  # nothing reached the client: another may serve
            # (its status kept: an answer that broke or made no sense is a 502 once no other
            # upstream does better)
            raise errors.UpstreamUnavailable(exc.message, status=exc.status,
                                             detail=exc.detail) from exc

    async def stream(self, opened: Opened, deliver: pump.Deliver, drain: pump.Drain) -> None:
        """Every batch of a streamed answer to `deliver` (False: wait for `drain` before the
        next), from the worker connection's own callbacks (gateway.pump) where its response
        offers them, else from this task; continued on other workers (gateway.failover) if
        the worker fails after its first byte."""
        job = opened.job
        seen = Progress(choices(job.req)) \
            if job is not None and self._resumable(opened) else None
        try:
            await self._pump(opened, deliver, drain, seen)
            return
        except (errors.UpstreamBroken, errors.UpstreamTimeout) as exc:
            _cut(opened, exc)
            if seen is None or job is None or seen.mixed:
                raise
            cause, failed = exc, opened.url
        for _ in range(self.failover_attempts):
            conts = await self._continue(job, seen, failed, cause)
            try:
                await self._pump_continued(conts, deliver, drain, seen)
                return
            except (errors.UpstreamBroken, errors.UpstreamTimeout) as exc:
                cut = conts[seen.cut][1]
                _cut(cut, exc)
                if seen.mixed:
                    raise
                cause, failed = exc, cut.url
        raise cause

    async def _pump_continued(self, conts: list[tuple[int, Opened]], deliver: pump.Deliver,
                              drain: pump.Drain, seen: Progress) -> None:
        """The continuations' batches to `deliver` as one stream, then their one usage."""
        async for batch in failover.merged([(c, self._relay(o)) for c, o in conts], seen):
            if not deliver(batch):
                await drain()
        if (usage := seen.usage()) is not None and not deliver([usage]):
            await drain()

    async def _pump(self, opened: Opened, deliver: pump.Deliver, drain: pump.Drain,
                    seen: Progress | None) -> None:
        """One worker's answer to `deliver`; accounted to its upstream like `_relay`."""
        if not hasattr(opened.resp, "attach"):
            relay = self._relay(opened)
            try:
                async for batch in relay:
                    if (seen is None or seen.track(batch)) and not deliver(batch):
                        await drain()
            finally:
                await relay.aclose()
            return
        ups = opened.job.route.upstreams if opened.job is not None else None
        try:
            first = opened.first
            if (seen is None or seen.track(first)) and not deliver(first):
                await drain()
            if opened.decoder.failed:  # the first read ended in a bad event: raise it now
                opened.decoder.close()
            if opened.more:
                resp: Any = opened.resp
                await pump.Pump(resp, opened.decoder, deliver, seen, self.idle).run(
                    drain)
            if ups is not None:
                ups.succeeded(opened.url, opened.ticket)
        except (errors.UpstreamBroken, errors.UpstreamTimeout):
            if ups is not None:  # the worker failed after its first byte
                ups.failed(opened.url, opened.ticket)
            raise
        finally:
            await opened.close(ups)

    def _resumable(self, opened: Opened) -> bool:
        job = opened.job
        return bool(self.failover_attempts and opened.more and job is not None
                    and job.req.stream and resumable(job.req, job.route.backend,
                                                               job.route.options))

    async def _continue(self, job: Job, seen: Progress, failed: str,
                        cause: errors.GatewayError) -> list[tuple[int, Opened]]:
        """Open a continuation of every open choice on another upstream, or re-raise `cause`
        (nothing is left open when one fails)."""
        wanted = seen.requests(job.req, job.route.backend, job.route.options)
        if wanted is None:
            raise cause
        if not wanted:  # cut after every choice finished: the answer is whole, asked of no one
            return []
        job.note.failovers += 1
        async def one(cont: canonical.InferenceRequest) -> Opened:
            if job.note.observer is not None:
                job.note.observer.failing_over()
            return await self.open(job.route, cont, job.request_id, job.note, avoid=failed)

        # all at once: each waits for its worker's first token
        got = await failover.all_or_none([one(cont) for _, cont in wanted],
                                         job.route.upstreams)
        opened = [(c, o) for (c, _), o in zip(wanted, got, strict=True) if isinstance(o, Opened)]
        if len(opened) < len(wanted):
            for _, o in opened:
                await o.close(job.route.upstreams)
            self.on_failover(job.request_id, job.route.name, failed, None, sum(seen.tokens))
            bug = next((e for e in got if not isinstance(e, Opened | errors.GatewayError)), None)
            if isinstance(bug, BaseException):  # not a worker's failure: a bug, as it was
                raise bug
            raise cause from None
        for _, o in opened:
            self.on_failover(job.request_id, job.route.name, failed, o.url,
                             sum(seen.tokens))
        return opened

    async def _relay(self, opened: Opened) -> AsyncGenerator[list[ev.Event], None]:
        """Event batches of one upstream answer, one per read."""
        loop = asyncio.get_running_loop()
        dog = deadline.IdleWatchdog(loop, self.idle)
        try:
            yield opened.first
            read = opened.resp.read_chunk
            dec = opened.decoder
            while opened.more:
                if dec.failed:  # the last read ended in a bad event: raise it now, not when
                    dec.close()  # the worker next writes (or the idle timeout fires)
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
                    if out := dec.close():
                        yield out
                    break
                dog.last = loop.time()
                if out := dec.feed(data):
                    yield out
            if opened.job is not None:
                opened.job.route.upstreams.succeeded(opened.url, opened.ticket)
        except (errors.UpstreamBroken, errors.UpstreamTimeout):
            if opened.job is not None:  # the worker failed after its first byte
                opened.job.route.upstreams.failed(opened.url, opened.ticket)
            raise
        finally:
            dog.cancel()
            await opened.close(opened.job.route.upstreams if opened.job else None)


def _cut(opened: Opened, exc: errors.GatewayError) -> None:
    """The attempt of `opened` failed after its first byte: it ends here, as a failed one
    (whether or not another worker continues it, or the request is asked again)."""
    if (job := opened.job) is not None:
        job.note.errors.append(_failure(opened.url, exc))
        if job.note.observer is not None:
            job.note.observer.end(opened.ticket, exc)


def _failure(url: str, exc: errors.GatewayError) -> str:
    """A failed attempt, as the request's log line lists it (`upstream_errors`)."""
    return f"{upstream.shown(url)}: {exc.message}" + (f" ({exc.detail})" if exc.detail else "")
