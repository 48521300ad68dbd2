"""gateway.deadline: `Deadline` (asyncio.timeout's semantics) and `Timeouts` (one timer handle
for every callback armed with one delay)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest

from gateway.deadline import Deadline, IdleWatchdog, Timeouts, timeouts


class ManualHandle:
    """A timer handle of `ManualClock`."""

    def __init__(self, when: float, callback: Callable[[], object]):
        self.due = when
        self.callback = callback
        self.done = False

    def when(self) -> float:
        return self.due

    def cancel(self) -> None:
        self.done = True


class ManualClock:
    """The part of an event loop that `Timeouts` and `IdleWatchdog` use (`time`, `call_at`),
    on a clock that moves only when `advance` moves it, running what falls due in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[ManualHandle] = []  # every one made, in order

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> ManualHandle:
        handle = ManualHandle(when, functools.partial(callback, *args))
        self.handles.append(handle)
        return handle

    def is_closed(self) -> bool:
        return True  # `timeouts` may drop its queues: the tests hold their own

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        raise AssertionError(context)

    def advance(self, seconds: float) -> None:
        """On to `seconds` later, running each handle due meanwhile at its time, in order."""
        end = self.now + seconds
        while due := [h for h in self.handles if not h.done and h.due <= end]:
            handle = min(due, key=ManualHandle.when)
            self.now = max(self.now, handle.due)
            handle.done = True
            handle.callback()
        self.now = end


def test_a_block_past_its_deadline_raises_timeout_and_the_task_is_not_left_cancelled() -> None:
    async def main() -> str:
        with pytest.raises(TimeoutError):
            with Deadline(0.01):
                await asyncio.sleep(5)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0)  # no cancellation left pending
        return "went on"

    assert asyncio.run(asyncio.wait_for(main(), 5)) == "went on"


def test_a_block_within_its_deadline_is_untouched_and_the_timer_is_disarmed() -> None:
    async def main() -> int:
        with Deadline(0.05):
            await asyncio.sleep(0)
            value = 7
        await asyncio.sleep(0.1)  # past the deadline: nothing fires any more
        return value

    assert asyncio.run(asyncio.wait_for(main(), 5)) == 7


def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    async def inner(started: asyncio.Event) -> None:
        with Deadline(5):
            started.set()
            await asyncio.sleep(5)

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.ensure_future(inner(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 5))


def test_an_outer_cancellation_at_the_same_time_as_the_deadline_wins() -> None:
    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        now = loop.time()
        loop.time = lambda: now  # type: ignore[method-assign]
        try:
            # due at the very time of the deadline (read from one clock reading: a stall
            # between the two could put them in different turns of the loop), so both
            # cancellations land before the task runs again
            with Deadline(0.01):
                loop.call_later(0.01, task.cancel)
                del loop.time
                await asyncio.sleep(5)
        finally:
            loop.__dict__.pop("time", None)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_outside_a_task_it_refuses() -> None:
    with pytest.raises(RuntimeError):
        with Deadline(1):
            pass


def test_timeouts_of_one_delay_share_one_timer_and_fire_in_order_unless_cancelled() -> None:
    """A thousand callbacks armed with one delay: one timer handle at a time, the cancelled
    ones never called, a re-armed one restarted, every other one called once, in order.
    On a manual clock: on the loop's, a machine that stalls the test past the delay before
    it re-arms (a loaded CI runner) made the re-armed one fall due with the first."""
    clock = ManualClock()
    queue = Timeouts(clock, 0.05)  # type: ignore[arg-type]
    called: list[int] = []
    for i in range(1000):
        queue.arm(i, functools.partial(called.append, i))
        if i % 2:
            queue.cancel(i)
    assert len(clock.handles) == 1
    clock.advance(0.02)
    queue.arm(0, functools.partial(called.append, -1))  # restarted: due last, at 0.07
    clock.advance(0.04)  # 0.06: all but the restarted one
    assert called == list(range(2, 1000, 2))
    clock.advance(0.2)
    assert called == [i for i in range(2, 1000, 2)] + [-1]
    assert len(clock.handles) == 2  # the first, the one re-armed after the others fell due


def test_timeouts_are_kept_per_loop_and_delay() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert timeouts(loop, 1.0) is timeouts(loop, 1.0)
        assert timeouts(loop, 1.0) is not timeouts(loop, 2.0)
        other = asyncio.new_event_loop()
        try:
            assert timeouts(other, 1.0) is not timeouts(loop, 1.0)
        finally:
            other.close()

    asyncio.run(main())


def test_a_callback_armed_by_a_firing_one_still_fires() -> None:
    """The server's head timer re-arms itself for a pipelined request from its own callback."""

    async def main() -> int:
        queue = timeouts(asyncio.get_running_loop(), 0.01)
        fired = 0

        def again() -> None:
            nonlocal fired
            fired += 1
            if fired < 3:
                queue.arm("conn", again)

        queue.arm("conn", again)
        await asyncio.sleep(0.2)
        return fired

    assert asyncio.run(asyncio.wait_for(main(), 5)) == 3


def test_the_idle_watchdog_fires_idle_after_the_last_activity_not_before() -> None:
    """Silent from the start: it fires at `idle` (the first check shares the loop's handle for
    that delay). Active until midway: it fires `idle` after the last activity. Cancelled: never.
    On a manual clock, so the times are exact: on the loop's, a stalled machine ran the checks
    late and failed the upper bounds."""
    async def main() -> None:  # a watchdog takes the task it is made in
        watch(ManualClock())

    asyncio.run(main())


def watch(clock: ManualClock) -> None:
    fired: dict[str, float] = {}
    loop: Any = clock
    silent = IdleWatchdog(loop, 0.2, lambda: fired.setdefault("silent", clock.now))
    silent.waiting = True
    active = IdleWatchdog(loop, 0.2, lambda: fired.setdefault("active", clock.now))
    active.waiting = True
    gone = IdleWatchdog(loop, 0.2, lambda: fired.setdefault("gone", clock.now))
    gone.waiting = True
    gone.cancel()
    clock.advance(0.15)
    active.last = clock.time()  # a chunk came
    clock.advance(0.1)
    assert fired == {"silent": pytest.approx(0.2)}
    clock.advance(0.4)
    for dog in (silent, active):
        dog.cancel()
    assert fired == {"silent": pytest.approx(0.2), "active": pytest.approx(0.35)}


def test_a_failing_callback_does_not_keep_the_others_due_with_it_from_running() -> None:
    async def main() -> tuple[list[str], list[Any]]:
        loop = asyncio.get_running_loop()
        reported: list[Any] = []
        loop.set_exception_handler(lambda _, ctx: reported.append(ctx.get("exception")))
        queue = timeouts(loop, 0.01)
        called: list[str] = []

        def boom() -> None:
            raise ValueError("boom")

        queue.arm("a", boom)
        queue.arm("b", functools.partial(called.append, "b"))
        await asyncio.sleep(0.1)
        return called, reported

    called, reported = asyncio.run(asyncio.wait_for(main(), 5))
    assert called == ["b"]
    assert len(reported) == 1 and isinstance(reported[0], ValueError)
