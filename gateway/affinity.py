"""Prefix affinity: consistent hashing with bounded loads over the prompt's leading blocks.

Requests that share a prompt prefix (a system prompt, the earlier turns of a conversation)
hash to the same point on a ring of virtual nodes, so they meet the worker whose KV cache
already holds that prefix (vLLM automatic prefix caching). Bounded loads (Mirrokni, Thorup,
Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2016; as in HAProxy's
`hash-balance-factor`) cap each worker at ceil((1 + epsilon) x mean load): a hot prefix
spills to the next worker on the ring instead of queueing on one.

The key is the part of the prompt that a conversation never rewrites: its opening (system
prompt and first user turn), cut at PREFIX_CHARS. Every later turn only appends, so all turns
keep the key, and every user of a system prompt at least PREFIX_CHARS long shares it. Routers
that match the longest prefix instead (vLLM production-stack's `PrefixAwareRouter`, a trie of
128-character chunk hashes; SGLang's `cache_aware` policy, an approximate radix tree of the
text each worker was sent, LRU-evicted) keep a table that grows with the traffic, on the
request path, and that each process of `server.workers` would learn apart; a hash of the
opening needs no state, and every process and gateway replica agrees on it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable
from hashlib import blake2b

from schemas import canonical

Clock = Callable[[], float]
VNODES = 64  # virtual nodes per upstream: spread within a few percent for a handful of workers
EPSILON = 0.25  # a worker may take up to 1.25x the mean load before the next one is asked
# The longest opening hashed: 256 characters are ~64 tokens of English (~4 characters a token),
# 4 vLLM KV blocks of 16 tokens. Shorter than most system prompts, so all users of one share a
# worker (and its cached blocks); long enough that prompts which merely begin alike ("You are a
# helpful assistant.") still differ in it by their first question, and spread.
PREFIX_CHARS = 256


def point(text: str) -> int:
    return int.from_bytes(blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "big")


def prefix_key(req: canonical.InferenceRequest) -> str:
    """The opening of the prompt as the worker will see it, cut at PREFIX_CHARS: chat, the
    messages' roles and texts in order up to and including the first user turn (the system
    prompt, any fixed preamble, the question that starts the conversation), which the later
    turns only extend; completions, the first prompt (no turns to tell apart: a prompt shorter
    than PREFIX_CHARS hashes whole, and shares at most a few blocks with its continuations)."""
    if req.messages is not None:
        parts: list[str] = []
        size = 0
        for m in req.messages:
            text = m.role + "\n" + m.text()[:PREFIX_CHARS] + "\n"
            parts.append(text)
            size += len(text)
            if m.role == "user" or size >= PREFIX_CHARS:
                break
        return "".join(parts)[:PREFIX_CHARS]
    first = (req.prompts or [""])[0]
    text = first if isinstance(first, str) else " ".join(map(str, first[:PREFIX_CHARS]))
    return text[:PREFIX_CHARS]


class Ring:
    """Virtual nodes of every upstream on a 64-bit ring."""

    def __init__(self, urls: Iterable[str] = ()):
        nodes = sorted((point(f"{u}#{i}"), u) for u in urls for i in range(VNODES))
        self._points = [p for p, _ in nodes]
        self._urls = [u for _, u in nodes]

    def walk(self, key: str, allowed: list[str], load: Callable[[str], float],
             epsilon: float) -> list[str]:
        """`allowed` in ring order from `key`'s point; the first whose load is under the bound
        goes first (the rest follow in ring order, for retries)."""
        order = self._distinct(point(key), set(allowed))
        order += [u for u in allowed if u not in order]  # not on the ring (added since)
        total = sum(load(u) for u in order)
        cap = math.ceil((1 + epsilon) * (total + 1) / len(order))
        for i, u in enumerate(order):
            if load(u) + 1 <= cap:
                return order[i:i + 1] + order[:i] + order[i + 1:]
        return order

    def _distinct(self, at: int, allowed: set[str]) -> list[str]:
        out: list[str] = []
        n = len(self._points)
        start = bisect.bisect_left(self._points, at)
        for j in range(n):
            u = self._urls[(start + j) % n]
            if u in allowed and u not in out:
                out.append(u)
                if len(out) == len(allowed):
                    break
        return out
