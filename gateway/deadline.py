"""Timers of the fixed hot paths: `Deadline`, `asyncio.timeout` as a plain (not async)
context manager, and `IdleWatchdog`, a worker's silence between chunks.

Each request crosses two deadlines (its body's `timeouts.request_read`, the worker's
`timeouts.first_byte`). `asyncio.timeout` builds a `Timeout`, awaits two coroutines
(`__aenter__`, `__aexit__`) and reschedules through `loop.time()`; this is one timer handle
and two method calls, with the same semantics as CPython 3.11's `asyncio.Timeout`: when the
deadline passes, the task is cancelled, and that cancellation (and only that one, counted with
`Task.cancelling`/`uncancel`) leaves the block as `TimeoutError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType


class Deadline:
    """`with Deadline(seconds):` raises TimeoutError out of a block that ran too long."""

    __slots__ = ("_cancelling", "_delay", "_fired", "_handle", "_task")

    def __init__(self, delay: float):
        self._delay = delay
        self._fired = False
        self._cancelling = 0
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[object] | None = None

    def __enter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline should be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._handle = asyncio.get_running_loop().call_later(self._delay, self._fire)
        return self

    def _fire(self) -> None:
        self._fired = True
        assert self._task is not None
        self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._fired and self._task is not None:
            self._fired = False
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc


class IdleWatchdog:
    """Cancels the reading task (or calls `on_idle`) when the worker is silent for `idle`
    seconds while `waiting`; `last` is when it last sent something.

    Costs one float store per chunk, where an asyncio.timeout per read costs about 5 us.
    """

    __slots__ = ("_handle", "_idle", "_loop", "fired", "last", "on_idle", "task", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, idle: float,
                 on_idle: Callable[[], None] | None = None):
        self._loop = loop
        self._idle = idle
        self.on_idle = on_idle
        self.task = asyncio.current_task()
        self.last = loop.time()
        self.waiting = False
        self.fired = False
        self._handle = loop.call_at(self.last + idle, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if not self.waiting:
            self.last = max(self.last, now)
        due = self.last + self._idle
        if self.waiting and now >= due and (self.on_idle or self.task) is not None:
            self.fired = True
            if self.on_idle is not None:
                self.on_idle()
            elif self.task is not None:
                self.task.cancel()
        else:
            self._handle = self._loop.call_at(max(due, now + 0.001), self._check)

    def cancel(self) -> None:
        self._handle.cancel()
