"""Prefix affinity: consistent hashing with bounded loads over the prompt's leading text.

Requests that share a prompt prefix (a system prompt, the earlier turns of a conversation)
hash to the same point on a ring of virtual nodes, so they meet the worker whose KV cache
already holds that prefix (vLLM automatic prefix caching). Bounded loads (Mirrokni, Thorup,
Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2016; as in HAProxy's
`hash-balance-factor`) cap each worker at ceil((1 + epsilon) x mean load): a hot prefix
spills to the next worker on the ring instead of queueing on one.
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
PREFIX_CHARS = 1024  # the leading text hashed: a few KV blocks' worth (vLLM blocks are 16 tokens)


def point(text: str) -> int:
    return int.from_bytes(blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "big")


def prefix_key(req: canonical.InferenceRequest) -> str:
    """The leading text of the prompt as the worker will see it: the messages' texts with their
    roles (chat), or the first prompt (completions), cut at PREFIX_CHARS."""
    if req.messages is not None:
        parts: list[str] = []
        size = 0
        for m in req.messages:
            text = m.role + "\n" + m.text() + "\n"
            parts.append(text)
            size += len(text)
            if size >= PREFIX_CHARS:
                break
        return "".join(parts)[:PREFIX_CHARS]
    first = (req.prompts or [""])[0]
    text = first if isinstance(first, str) else " ".join(map(str, first))
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
