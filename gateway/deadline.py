"""Timers of the fixed hot paths: `Timeouts`, one timer handle for every callback armed with
the same delay; `Deadline`, `asyncio.timeout` as a plain (not async) context manager on it; and
`IdleWatchdog`, a worker's silence between chunks.

Each request crosses two deadlines (its body's `timeouts.request_read`, the worker's
`timeouts.first_byte`) and its connection two more (the head's, then keep-alive's). A uvloop
timer handle costs about 4 us to arm and cancel (a libuv timer made, started, stopped and
closed each time): four of them were about a twentieth of a whole answer's CPU. Callbacks
armed with one delay fall due in the order they were armed, so one handle, set for the
earliest, serves them all, and arming or cancelling one is a dict operation. `Deadline` keeps
CPython 3.11's `asyncio.Timeout` semantics: when the deadline passes, the task is cancelled,
and that cancellation (and only that one, counted with `Task.cancelling`/`uncancel`) leaves
the block as `TimeoutError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from types import TracebackType

# libuv's timers tick in milliseconds: a callback due within one tick of the handle's firing
# is called with it (asyncio's own loop does the same with its clock resolution).
TICK = 0.001


class Timeouts:
    """Callbacks due `delay` seconds after they were armed, on one loop, by one timer handle."""

    __slots__ = ("_due", "_handle", "_loop", "delay")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float):
        self._loop = loop
        self.delay = delay
        # key -> (when, callback), in the order armed, which is the order due
        self._due: dict[Hashable, tuple[float, Callable[[], None]]] = {}
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, key: Hashable, callback: Callable[[], None]) -> None:
        """Call `callback` after `delay` unless `cancel(key)` comes first (re-arming a key
        restarts it)."""
        due = self._due
        if key in due:
            del due[key]  # to the end: the order of the dict is the order due
        when = self._loop.time() + self.delay
        due[key] = (when, callback)
        if self._handle is None:
            self._handle = self._loop.call_at(when, self._fire)

    def cancel(self, key: Hashable) -> None:
        self._due.pop(key, None)

    def _fire(self) -> None:
        self._handle = None
        limit = self._loop.time() + TICK
        due = self._due
        ready: list[tuple[Hashable, Callable[[], None]]] = []
        for key, (when, callback) in due.items():
            if when > limit:  # the earliest still waiting: the handle is set for it
                self._handle = self._loop.call_at(when, self._fire)
                break
            ready.append((key, callback))
        for key, _ in ready:
            del due[key]
        for _, callback in ready:
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - as the loop treats a failing handle
                self._loop.call_exception_handler(
                    {"message": "a timeout callback failed", "exception": exc})


_queues: dict[tuple[asyncio.AbstractEventLoop, float], Timeouts] = {}


def timeouts(loop: asyncio.AbstractEventLoop, delay: float) -> Timeouts:
    """The loop's `Timeouts` of `delay`, made on first use."""
    found = _queues.get((loop, delay))
    if found is None:
        if len(_queues) > 64:  # loops that ended (tests run one each): let them go
            for key in [k for k in _queues if k[0].is_closed()]:
                del _queues[key]
        found = _queues[(loop, delay)] = Timeouts(loop, delay)
    return found


class Deadline:
    """`with Deadline(seconds):` raises TimeoutError out of a block that ran too long."""

    __slots__ = ("_cancelling", "_delay", "_fired", "_queue", "_task")

    def __init__(self, delay: float):
        self._delay = delay
        self._fired = False
        self._cancelling = 0
        self._queue: Timeouts | None = None
        self._task: asyncio.Task[object] | None = None

    def __enter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline should be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._queue = timeouts(task.get_loop(), self._delay)
        self._queue.arm(self, self._fire)
        return self

    def _fire(self) -> None:
        self._fired = True
        assert self._task is not None
        self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._queue is not None:
            self._queue.cancel(self)
        if self._fired and self._task is not None:
            self._fired = False
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc


class IdleWatchdog:
    """Cancels the reading task (or calls `on_idle`) when the worker is silent for `idle`
    seconds while `waiting`; `last` is when it last sent something.

    Costs one float store per chunk, where an asyncio.timeout per read costs about 5 us.
    """

    __slots__ = ("_first", "_handle", "_idle", "_loop", "fired", "last", "on_idle", "task",
                 "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop, idle: float,
                 on_idle: Callable[[], None] | None = None):
        self._loop = loop
        self._idle = idle
        self.on_idle = on_idle
        self.task = asyncio.current_task(loop)  # given the loop: no getpid() on 3.11
        self.last = loop.time()
        self.waiting = False
        self.fired = False
        # The first check, `idle` after the start, shares the loop's handle for that delay
        # (most answers end before it); a check after activity is due at its own time.
        self._first: Timeouts | None = timeouts(loop, idle)
        self._first.arm(self, self._check)
        self._handle: asyncio.TimerHandle | None = None

    def _check(self) -> None:
        self._first = None
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
        """For good; the references out go too: a callback bound to its owner (the pump's)
        would make a cycle that only the garbage collector could free."""
        if self._first is not None:
            self._first.cancel(self)
        if self._handle is not None:
            self._handle.cancel()
        self.on_idle = self.task = None
