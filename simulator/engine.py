"""The simulated engine's capacity: a batch limit with a FIFO queue behind it, per-token time
that grows with the batch, and a prefix cache, so routing effects show without a GPU.

As in vLLM: requests beyond `max_batch` wait (`vllm:num_requests_waiting`); a batch of B
running requests decodes each step slower than one alone (memory-bound decode, modelled as
`itl x (1 + batch_slowdown x (B - 1))`); prefill costs `prefill_ms_per_token` for each prompt
token not already in the prefix cache, which holds blocks of `block_tokens` ids hashed as a
chain (automatic prefix caching: a block is reused only with everything before it) and
evicts least recently used. /metrics publishes vLLM v1's gauge names.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator

from simulator.settings import SimulatorSettings


class Engine:
    """Shared by every request of one simulator process."""

    def __init__(self, settings: SimulatorSettings) -> None:
        self.settings = settings
        self.running = 0
        self.waiting = 0
        self._slots = asyncio.Semaphore(settings.max_batch) if settings.max_batch else None
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = self.hits = 0  # prompt tokens looked up / found in the prefix cache

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a batch slot for the body of the `async with` (queued FIFO when full)."""
        if self._slots is not None:
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            if self._slots is not None:
                self._slots.release()

    def step_factor(self) -> float:
        """How much slower a decode step is with the current batch than alone."""
        return 1.0 + self.settings.batch_slowdown * max(0, self.running - 1)

    def prefill_s(self, prompt: list[int]) -> float:
        """Prefill time for `prompt`: its tokens past the cached leading blocks."""
        per_token = self.settings.prefill_ms_per_token / 1000
        if not per_token:
            return 0.0
        return per_token * (len(prompt) - self.cached(prompt))

    def cached(self, prompt: list[int]) -> int:
        """Leading tokens found in the prefix cache; every full block is cached afterwards."""
        size, capacity = self.settings.block_tokens, self.settings.prefix_cache_blocks
        if not capacity:
            return 0
        found, chain, hit = 0, 0, True
        for start in range(0, len(prompt) - size + 1, size):
            chain = hash((chain, *prompt[start:start + size]))
            if hit and chain in self._blocks:
                found += size
                self._blocks.move_to_end(chain)
            else:
                hit = False
                self._blocks[chain] = None
        while len(self._blocks) > capacity:
            self._blocks.popitem(last=False)
        self.queries += len(prompt)
        self.hits += found
        return found

    def cache_usage(self) -> float:
        """KV cache in use, 0..1: the running batch's share of its slots (cached prefixes
        are free to reuse, as vLLM counts them)."""
        if not self.settings.max_batch:
            return 0.0
        return min(1.0, self.running / self.settings.max_batch)

    def metrics(self) -> bytes:
        """Prometheus text in vLLM v1's names (vllm/v1/metrics/loggers.py)."""
        labels = f'{{engine="0",model_name="{self.settings.served_name}"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", "Number of requests in model execution "
             "batches.", float(self.running)),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be "
             "processed.", float(self.waiting)),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
             self.cache_usage()),
            ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of "
             "number of queried tokens.", float(self.queries)),
            ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number "
             "of cached tokens.", float(self.hits)),
        ]
        out = []
        for name, kind, text, value in rows:
            base = name.removesuffix("_total")
            out += [f"# HELP {base} {text}", f"# TYPE {base} {kind}", f"{name}{labels} {value}"]
        return ("\n".join(out) + "\n").encode()
