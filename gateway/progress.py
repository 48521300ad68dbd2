"""What a stream's client has been sent of each choice (`Progress`), and whether its
request can be continued on another worker (gateway.failover). Apart from the merging
coroutines: tracking runs on every streamed chunk, so this module is one setup.py compiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

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
        """Note a batch on its way out (a few type checks per event: this runs per chunk;
        `isinstance` narrows the event, so the compiled build reads its fields natively)."""
        try:
            for e in batch:
                if isinstance(e, ev.TextDelta):
                    c = e.choice
                    self.texts[c].append(e.text)
                    ids = e.token_ids
                    self.tokens[c] += len(ids) if ids else 1
                elif isinstance(e, ev.Finish):
                    self.finished[e.choice] = True
                elif isinstance(e, ev.ReasoningDelta | ev.ToolCallDelta):
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
