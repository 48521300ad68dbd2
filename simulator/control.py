"""Per-request connection control and server counters, for fault directives and /_sim/stats."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
_DROP_WAIT_S = 1.0  # how long a deliberate drop waits for the server to see the socket close


class Stats:
    """What tests read from /_sim/stats; `active` is a gauge, the rest count since reset."""

    __slots__ = ("aborted", "active", "completed", "dropped", "last_abort_at", "requests")

    def __init__(self) -> None:
        self.active = 0
        self.reset()

    def reset(self) -> None:
        """Zero the counters (not the gauge: streams in flight still end)."""
        self.requests = self.completed = self.aborted = self.dropped = 0
        self.last_abort_at: float | None = None

    def begin(self) -> None:
        """A generation request arrived."""
        self.requests += 1
        self.active += 1

    def end(self) -> None:
        """A generation request is over, however it ended."""
        self.active -= 1

    def complete(self) -> None:
        """The whole response (an error response too) went out."""
        self.completed += 1

    def abort(self) -> None:
        """The client went away before the end."""
        self.aborted += 1
        self.last_abort_at = time.time()

    def as_dict(self) -> dict[str, Any]:
        """The /_sim/stats body."""
        return {name: getattr(self, name) for name in self.__slots__}


class Connection:
    """One request's link to its client: notices a disconnect at once, drops or hangs on demand.

    A watcher task waits on `receive()`; on `http.disconnect` it cancels the request's task
    unless the response is already finishing (uvicorn also reports disconnect once complete).
    """

    def __init__(
        self,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
        stats: Stats,
    ) -> None:
        self.send, self.stats = send, stats
        self._task = asyncio.current_task()
        self._gone = asyncio.Event()
        self._finishing = self._cancelled = False
        self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Callable[[], Awaitable[Message]]) -> None:
        """Wait for the client to go; then stop the generation."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone.set()
        if not self._finishing and self._task is not None:
            self._cancelled = True
            self._task.cancel()

    def finishing(self) -> None:
        """The last bytes are being sent: a disconnect from now on is the normal end."""
        self._finishing = True

    def client_gone(self) -> bool:
        """Whether the request was cancelled because its client disconnected."""
        if self._cancelled and self._task is not None:
            self._task.uncancel()
        return self._cancelled

    def close(self) -> None:
        """Stop watching."""
        self._watcher.cancel()

    def _transport(self) -> Any:
        """uvicorn's transport behind `send` (its bound cycle method), or None elsewhere."""
        return getattr(getattr(self.send, "__self__", None), "transport", None)

    async def cut_on_shutdown(self) -> bool:
        """The server cancelled us (graceful-shutdown timeout): cut the socket, end quietly."""
        transport = self._transport()
        if transport is None or self._task is None:
            return False
        self._finishing = True
        transport.close()
        self._task.uncancel()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._gone.wait(), _DROP_WAIT_S)
        return True

    async def drop(self) -> None:
        """Close the socket now, mid-response or before any byte: the client sees a cut."""
        self._finishing = True
        self.stats.dropped += 1
        transport = self._transport()
        if transport is None:  # not uvicorn: an exception is how other servers cut a response
            raise ConnectionAbortedError("simulated connection drop")
        transport.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._gone.wait(), _DROP_WAIT_S)

    async def hang(self) -> None:
        """Send nothing more, forever: only the client leaving ends this."""
        await asyncio.Event().wait()
