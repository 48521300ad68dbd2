"""Continuing a stream whose worker failed after the first byte (`server.failover_attempts`).

The client has been sent part of each choice; every choice not yet finished is asked of another
worker as a request of its own (`n` 1: each choice has its own text so far), built by the
backend (`Backend.continuation`, given the model's options: the prompt plus that text, the chat
with it as the assistant's unfinished turn, or the chat rendered with the model's template plus
that text, and what is left of the token budget). Their answers are merged
into the client's one stream: each continuation's events renumbered to the choice it continues,
its opening (role, prompt information) dropped, and its usage held back until all have ended,
then sent once, counting the client's prompt and every completion token of every choice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Coroutine
from typing import Any, Protocol, TypeVar

from gateway.progress import Progress
from schemas import events as ev


async def merged(relays: list[tuple[int, AsyncGenerator[list[ev.Event], None]]],
                 seen: Progress) -> AsyncGenerator[list[ev.Event], None]:
    """Batches of several continuations as they come, each as the client's (`resumed`);
    the first failure ends them all and is raised, its relay's index in `seen.cut`."""
    seen.cut = 0
    if len(relays) == 1:
        choice, relay = relays[0]
        try:
            async for batch in relay:
                if out := seen.resumed(choice, batch):
                    yield out
        finally:
            await relay.aclose()
        return
    queue: asyncio.Queue[tuple[int, list[ev.Event] | BaseException | None]] = asyncio.Queue(8)

    async def drain(i: int, relay: AsyncGenerator[list[ev.Event], None]) -> None:
        try:
            async for batch in relay:
                await queue.put((i, batch))
        except Exception as exc:
            await queue.put((i, exc))
            return
        await queue.put((i, None))

    tasks = [asyncio.ensure_future(drain(i, r)) for i, (_, r) in enumerate(relays)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                seen.cut = i
                raise item
            elif out := seen.resumed(relays[i][0], item):
                yield out
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _, relay in relays:
            await relay.aclose()


class _Opened(Protocol):
    async def close(self, upstreams: Any) -> None: ...


OpenedT = TypeVar("OpenedT", bound=_Opened)


async def all_or_none(opening: list[Coroutine[Any, Any, OpenedT]], ups: Any
                      ) -> list[OpenedT | BaseException]:
    """Every continuation's opening (pipeline.Opened), or its exception. Cancelled (the
    client left while the others were still opening), those that had opened are closed
    before the cancellation goes on: nothing else holds them, and each holds its worker's
    connection and in-flight count (`ups`: the upstreams that count them)."""
    tasks = [asyncio.ensure_future(c) for c in opening]
    try:
        return await asyncio.gather(*tasks, return_exceptions=True)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks)  # gather has cancelled them: each ends at once
        for t in tasks:
            if not t.cancelled() and t.exception() is None:
                await t.result().close(ups)
        raise
