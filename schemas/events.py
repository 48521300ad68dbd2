"""Canonical stream events: what every worker decoder yields and every client encoder consumes.

Plain slotted dataclasses, not pydantic: one is made per token on the hot path. Each writes its
own `__init__` (`init=False`): compiled (setup.py), the decoders then build events by a native
call, where the generated `__init__` runs as interpreted code (about 1,500 instructions an
event, bench/RESULTS.md section 24); fields, equality, `repr`, `replace` and `asdict` stay the
dataclass's.
An upstream failure is not an event: decoders raise a `GatewayError` (see errors.py), and the
relay turns it into the client protocol's in-band error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# The richest form a worker can tell us; encoders coarsen it (OpenAI "stop", LMI "eos_token").
FinishReason = Literal[
    "eos", "stop_string", "stop_token", "length", "tool_calls", "content_filter", "abort", "error"
]


@dataclass(slots=True, init=False)
class TopLogprob:
    """One alternative token at a position."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    id: int | None = None

    def __init__(self, token: str, logprob: float, bytes: list[int] | None = None,
                 id: int | None = None) -> None:
        self.token = token
        self.logprob = logprob
        self.bytes = bytes
        self.id = id


@dataclass(slots=True, init=False)
class TokenLogprob:
    """The sampled token at one position, with its alternatives; no log prob (None) for the
    first token of an echoed prompt, which nothing precedes (vLLM's `token_logprobs[0]`)."""

    token: str
    logprob: float | None
    bytes: list[int] | None = None
    id: int | None = None
    top: list[TopLogprob] = field(default_factory=list)
    # The worker's own word on a special token (TGI's `Token.special`); None where it says
    # none, and `token` is then the text a client's token object shows for it (`</s>`).
    special: bool | None = None

    def __init__(self, token: str, logprob: float | None, bytes: list[int] | None = None,
                 id: int | None = None, top: list[TopLogprob] | None = None,
                 special: bool | None = None) -> None:
        self.token = token
        self.logprob = logprob
        self.bytes = bytes
        self.id = id
        self.top = [] if top is None else top
        self.special = special


@dataclass(slots=True, init=False)
class Role:
    """A choice starts; workers that never say so get one synthesised by encoders."""

    choice: int
    role: str = "assistant"

    def __init__(self, choice: int, role: str = "assistant") -> None:
        self.choice = choice
        self.role = role


@dataclass(slots=True, init=False)
class TextDelta:
    """Generated text for one choice, with the token ids and logprobs behind it when known."""

    choice: int
    text: str
    token_ids: list[int] | None = None
    logprobs: list[TokenLogprob] | None = None

    def __init__(self, choice: int, text: str, token_ids: list[int] | None = None,
                 logprobs: list[TokenLogprob] | None = None) -> None:
        self.choice = choice
        self.text = text
        self.token_ids = token_ids
        self.logprobs = logprobs

    def per_token(self, unknown_id: int = -1) -> list[tuple[int, str, TokenLogprob | None]]:
        """One (id, text, logprob) per generated token, for protocols that write a line per
        token (TGI, LMI): texts join to the delta's text (the logprobs' token texts when they
        add up to it, else all of it on the first token)."""
        ids, lps = self.token_ids, self.logprobs
        n = len(ids) if ids else (len(lps) if lps else 1)
        if n == 1:
            texts = [self.text]
        elif lps is not None and len(lps) == n and "".join(t.token for t in lps) == self.text:
            texts = [t.token for t in lps]
        else:
            texts = [self.text] + [""] * (n - 1)
        out = []
        for i in range(n):
            lp = lps[i] if lps is not None and i < len(lps) else None
            tid = ids[i] if ids else (lp.id if lp is not None and lp.id is not None
                                      else unknown_id)
            out.append((tid, texts[i], lp))
        return out


@dataclass(slots=True, init=False)
class ReasoningDelta:
    """Reasoning ("thinking") text, kept apart from the answer."""

    choice: int
    text: str

    def __init__(self, choice: int, text: str) -> None:
        self.choice = choice
        self.text = text


@dataclass(slots=True, init=False)
class ToolCallDelta:
    """A fragment of one tool call; id and name come with the first fragment of a call."""

    choice: int
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def __init__(self, choice: int, index: int, id: str | None = None,
                 name: str | None = None, arguments: str = "") -> None:
        self.choice = choice
        self.index = index
        self.id = id
        self.name = name
        self.arguments = arguments


@dataclass(slots=True, init=False)
class Finish:
    """A choice ended; `matched` is the stop string or stop token id when one ended it."""

    choice: int
    reason: FinishReason
    matched: str | int | None = None

    def __init__(self, choice: int, reason: FinishReason,
                 matched: str | int | None = None) -> None:
        self.choice = choice
        self.reason = reason
        self.matched = matched


@dataclass(slots=True, init=False)
class Usage:
    """Token counts for the whole request."""

    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None

    def __init__(self, prompt_tokens: int, completion_tokens: int,
                 reasoning_tokens: int | None = None, cached_tokens: int | None = None) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.reasoning_tokens = reasoning_tokens
        self.cached_tokens = cached_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True, init=False)
class PromptInfo:
    """What a worker says about the prompt: its token ids and per-token logprobs (with the
    alternatives it gave in `top`), and each prompt token's rank where the worker says it."""

    choice: int
    token_ids: list[int] | None = None
    logprobs: list[TokenLogprob | None] | None = None
    ranks: list[int | None] | None = None

    def __init__(self, choice: int, token_ids: list[int] | None = None,
                 logprobs: list[TokenLogprob | None] | None = None,
                 ranks: list[int | None] | None = None) -> None:
        self.choice = choice
        self.token_ids = token_ids
        self.logprobs = logprobs
        self.ranks = ranks


Event = Role | TextDelta | ReasoningDelta | ToolCallDelta | Finish | Usage | PromptInfo
