"""Socket writes held to the event loop's next turn while the gateway is busy, so that each
turn's answers and worker requests leave together.

uvloop already sends a turn's writes after that turn's reads (its check phase). Under load the
gateway's writes still went out a few at a time, one turn's worth after another, each waking
the process that reads them (the client, the worker) on another core: `perf` put a sixth of a
whole answer's CPU in the kernel's wake-up of the reader (bench/RESULTS.md §29f). Held one
turn more, the writes of two turns' reads leave in one burst, whose readers are woken once:
whole answers at 32 clients took about a quarter less CPU each (§31c). With one request at a
time there is nothing to gather and the turn more would be latency, so writes go straight
through while the last turn wrote to one connection only; two or more, and they are held.

Order on a connection is kept: every write of the server's and the worker client's connections
comes here, and a connection that closes sends what it holds first (`flush`). A connection
that is closing when its turn comes (the peer left, the request was cancelled) drops it.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Final


class WriteBatch:
    """One event loop's held writes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # weakly: `of` keeps batches by their loop, whose entry would otherwise never go
        self.loop = weakref.ref(loop)
        self.held: dict[asyncio.WriteTransport, list[bytes]] = {}
        self.holding = False  # the last turn wrote to two connections or more
        self.scheduled = False  # `_turn` is to run at the start of the next turn
        self.last: asyncio.WriteTransport | None = None
        self.written = 0  # connections written to this turn, while not holding

    def write(self, transport: asyncio.WriteTransport, data: bytes) -> None:
        if not self.holding:
            transport.write(data)
            if transport is not self.last:
                self.last = transport
                self.written += 1
                if not self.scheduled:
                    self._schedule()
            return
        held = self.held.get(transport)
        if held is None:
            self.held[transport] = [data]
            if not self.scheduled:
                self._schedule()
        else:
            held.append(data)

    def _schedule(self) -> None:
        loop = self.loop()
        if loop is not None:
            self.scheduled = True
            loop.call_soon(self._turn)

    def flush(self, transport: asyncio.WriteTransport) -> None:
        """What `transport` holds, sent now: it is about to close."""
        held = self.held.pop(transport, None)
        if held:
            transport.write(held[0] if len(held) == 1 else b"".join(held))

    def _turn(self) -> None:
        """The previous turn's held writes leave; whether this turn holds its own."""
        self.scheduled = False
        if not self.holding:
            self.holding = self.written >= 2
            self.written = 0
            self.last = None
            return
        held = self.held
        self.held = {}
        self.holding = len(held) >= 2
        for transport, data in held.items():
            if transport.is_closing():
                continue  # the peer left, or the request was cancelled: nothing to send
            try:
                transport.write(data[0] if len(data) == 1 else b"".join(data))
            except (OSError, RuntimeError):  # gone meanwhile: as a write to it would have
                transport.abort()


_BATCHES: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WriteBatch]] = \
    weakref.WeakKeyDictionary()


def of(loop: asyncio.AbstractEventLoop) -> WriteBatch:
    """The batch of `loop` (a serving process has one loop; tests start several)."""
    batch = _BATCHES.get(loop)
    if batch is None:
        batch = _BATCHES[loop] = WriteBatch(loop)
    return batch
