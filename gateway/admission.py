"""`server.max_concurrent_requests`: requests in flight in the whole gateway, not per process.

With `server.workers: N` each serving process admits requests on its own, and the kernel
hands it connections by their address hash, not by its load: a limit counted per process
let the gateway hold N times the setting (a worker sized for it overloaded), and which
request was refused depended on which process its connection reached. TGI's router, which
the setting's name and its `/info` field come from, counts one semaphore for the whole
server (router/src/infer/mod.rs, `limit_concurrent_requests`). So the processes share one
count: a slot per serving process in a small shared file (`Slots`), each written only by its
own process, and admission takes its place first and then sums every slot; two processes
racing for the last place may both refuse (the client retries after Retry-After), neither
goes past the limit. A serving process that dies leaves its slot behind: the parent zeroes
it before the process is started again. One process alone keeps its plain counter.
"""

from __future__ import annotations

import mmap
import os

SLOT = 8  # one signed 64-bit count per serving process
FILE = "admission"  # in the directory the parent makes for the processes (gateway.board's)


class Admission:
    """Admits a request while the gateway has fewer than `limit` in flight."""

    __slots__ = ("count", "limit", "_index", "_map", "_slots")

    def __init__(self, limit: int, directory: str | None = None, index: int = 0):
        self.limit = limit
        self.count = 0  # this process's own
        self._index = index
        self._map: mmap.mmap | None = None
        self._slots: memoryview | None = None
        if directory is not None:  # one of several serving processes: the shared slots
            with open(os.path.join(directory, FILE), "r+b") as f:
                self._map = mmap.mmap(f.fileno(), 0)
            self._slots = memoryview(self._map).cast("q")

    def enter(self) -> bool:
        """Take a place; False (nothing taken) when the gateway is at its limit."""
        slots = self._slots
        if slots is None:
            if self.count >= self.limit:
                return False
        else:
            slots[self._index] += 1  # own place first: see the module docstring
            if sum(slots) > self.limit:
                slots[self._index] -= 1
                return False
        self.count += 1
        return True

    def leave(self) -> None:
        """Give back the place `enter` took."""
        self.count -= 1
        if self._slots is not None:
            self._slots[self._index] -= 1


class Slots:
    """The parent's side: the shared file, one zeroed slot per serving process."""

    def __init__(self, directory: str, n: int):
        self.path = os.path.join(directory, FILE)
        with open(self.path, "wb") as f:
            f.write(bytes(SLOT * n))

    def clear(self, index: int) -> None:
        """Slot `index` back to 0: its process died with requests admitted."""
        with open(self.path, "r+b") as f:
            f.seek(SLOT * index)
            f.write(bytes(SLOT))
