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
import dataclasses
from collections.abc import AsyncGenerator, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from adapters import base
from schemas import canonical
from schemas import events as ev

_OPENING = (ev.Role, ev.PromptInfo)  # a continuation's own opening: not the client's
_CHOSEN = (ev.TextDelta, ev.ReasoningDelta, ev.ToolCallDelta, ev.Finish)  # carry `choice`


def choices(req: canonical.InferenceRequest) -> int:
    """How many choices the client's answer has: `n` of each prompt."""
    return req.sampling.n * max(1, len(req.prompts or ()))


def one_choice(req: canonical.InferenceRequest) -> canonical.InferenceRequest:
    """The request for one of its choices alone (`n` 1)."""
    if req.sampling.n == 1:
        return req
    return dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, n=1))


def limited(req: canonical.InferenceRequest, backend: base.Backend) -> canonical.InferenceRequest:
    """The request with the token limit its first attempt had, named: a client that set none
    got the protocol's default (OpenAI and vLLM completions: 16; `Backend.token_limit`), so a
    continuation asks for what is left of that, not for the default again."""
    if req.sampling.max_tokens is not None:
        return req
    limit = backend.token_limit(req)
    if limit is None:
        return req
    return dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, max_tokens=limit))


def resumable(req: canonical.InferenceRequest, backend: base.Backend,
              options: Mapping[str, Any] = base.NO_OPTIONS) -> bool:
    """Whether each choice of `req` can be continued by this backend's workers: one prompt
    (choices of several prompts would each need their own), no `best_of` (its choices are
    picked from more than are sent), and what the backend continues (with the model's
    `options`)."""
    return (len(req.prompts or ()) <= 1 and not req.sampling.best_of
            and backend.continues(one_choice(req), options))


class Progress:
    """What the client has been sent of each choice: its text pieces, a token count (one per
    text event unless the worker gave ids) and whether it finished. `mixed`: something besides
    plain text went out (reasoning, a tool call, a choice the request did not ask for), which
    no continuation can carry on."""

    __slots__ = ("base", "cut", "finished", "held", "mixed", "texts", "tokens")

    def __init__(self, n: int) -> None:
        self.texts: list[list[str]] = [[] for _ in range(n)]
        self.tokens = [0] * n
        self.finished = [False] * n
        self.mixed = False
        self.base: list[int] = []  # tokens per choice when the current continuations began
        self.held: list[tuple[int, ev.Usage]] = []  # the continuations' usage, by choice
        self.cut = 0  # which of the continuations failed (`merged`)

    def track(self, batch: list[ev.Event]) -> bool:
        """Note a batch on its way out (a few type checks per event: this runs per chunk)."""
        try:
            for e in batch:
                kind = type(e)
                if kind is ev.TextDelta:
                    c = e.choice  # type: ignore[union-attr]
                    self.texts[c].append(e.text)  # type: ignore[union-attr]
                    ids = e.token_ids  # type: ignore[union-attr]
                    self.tokens[c] += len(ids) if ids else 1
                elif kind is ev.Finish:
                    self.finished[e.choice] = True  # type: ignore[union-attr]
                elif kind is ev.ReasoningDelta or kind is ev.ToolCallDelta:
                    self.mixed = True
        except IndexError:  # a choice the request did not ask for
            self.mixed = True
        return True

    def open(self) -> list[int]:
        """The choices still to finish, in order."""
        return [c for c, done in enumerate(self.finished) if not done]

    def requests(self, req: canonical.InferenceRequest, backend: base.Backend,
                 options: Mapping[str, Any] = base.NO_OPTIONS
                 ) -> list[tuple[int, canonical.InferenceRequest]] | None:
        """A continuation of each open choice, or None when one cannot be continued; from
        now on the continuations' events count on what was sent so far."""
        one = limited(one_choice(req), backend)
        out = []
        for c in self.open():
            cont = backend.continuation(one, "".join(self.texts[c]), self.tokens[c], options)
            if cont is None:
                return None
            out.append((c, cont))
        self.base = list(self.tokens)
        self.held.clear()
        return out

    def resumed(self, choice: int, batch: list[ev.Event]) -> list[ev.Event]:
        """A continuation's batch as the client's stream: renumbered to `choice`, its opening
        dropped, its usage held for `usage`."""
        out: list[ev.Event] = []
        for e in batch:
            if isinstance(e, _OPENING):
                continue
            if isinstance(e, ev.Usage):
                self.held.append((choice, e))
                continue
            if isinstance(e, _CHOSEN):
                e.choice = choice
            out.append(e)
        self.track(out)
        return out

    def usage(self) -> ev.Usage | None:
        """The one usage of the whole answer: the client's prompt (a continuation's prompt
        less the text it was given) and every token generated for it, by every worker."""
        if not self.held:
            return None
        choice, first = self.held[0]
        prompt = max(0, first.prompt_tokens - self.base[choice])
        completion = sum(self.base) + sum(u.completion_tokens for _, u in self.held)
        return ev.Usage(prompt, completion)


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
