"""A whole answer that its worker streamed (gateway.whole), folded into one completion.

Relayed as a stream is, so a worker that fails after its first byte is continued on another
(gateway.failover). Where that cannot be done (a request no continuation carries on, none
left of `server.failover_attempts`), nothing has reached the client yet: the request is asked
again from its start on another upstream, as any failure before the client's first byte is
(SPEC.md: retried on another upstream, bounded: `server.retries` times at most).
"""

from __future__ import annotations

from gateway import pipeline, routing
from schemas import canonical, errors
from schemas import events as ev


async def folded(pipe: pipeline.Pipeline, route: routing.Route, opened: pipeline.Opened,
                 req: canonical.InferenceRequest, request_id: str, note: pipeline.Attempt
                 ) -> canonical.Completion:
    """The whole answer `opened` streams (`per_token`: each chunk keeps its token); `req` is
    the client's request, asked again where the stream is cut past continuing."""
    ups = route.upstreams
    for again in range(pipe.retries + 1):
        done = canonical.Completion.fold(() if opened.more else opened.first,
                                         req.choice_count, req.per_token)
        if not opened.more:  # asked again, and answered in its first read
            await opened.close(ups)
            return done

        def fold(batch: list[ev.Event], done: canonical.Completion = done) -> bool:
            for e in batch:
                done.add(e)
            return True

        try:
            await pipe.stream(opened, fold, _nothing_to_drain)
            return done
        except (errors.UpstreamBroken, errors.UpstreamTimeout):
            if again == pipe.retries or not any(u != opened.url and ups.usable(u)
                                                for u in ups.all):
                raise  # no other upstream to ask: the worker's failure is the answer
        opened = await pipe.open(route, req, request_id, note, avoid=opened.url)
    raise AssertionError("unreachable: the last try returns or raises")


async def _nothing_to_drain() -> None:
    """A whole answer's fold takes every batch at once: never behind."""
