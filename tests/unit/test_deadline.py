"""gateway.deadline.Deadline: asyncio.timeout's semantics on one timer handle."""

from __future__ import annotations

import asyncio

import pytest

from gateway.deadline import Deadline


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
        with Deadline(0.01):
            # due with the deadline: both cancellations land before the task runs again
            asyncio.get_running_loop().call_later(0.01, task.cancel)
            await asyncio.sleep(5)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_outside_a_task_it_refuses() -> None:
    with pytest.raises(RuntimeError):
        with Deadline(1):
            pass
