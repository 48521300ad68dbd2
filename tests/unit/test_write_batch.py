"""gateway.write_batch: writes go straight out while one connection writes a turn; held one turn
more, in order and joined per connection, once a turn wrote to two or more."""

from __future__ import annotations

import asyncio
import gc

from gateway import write_batch


class Transport:
    """What the batch calls of a transport, recorded."""

    def __init__(self, fails: bool = False) -> None:
        self.sent: list[bytes] = []
        self.closing = self.aborted = False
        self.fails = fails

    def write(self, data: bytes) -> None:
        if self.fails:
            raise RuntimeError("the handle is closed")
        self.sent.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.aborted = True


async def next_turn() -> None:
    await asyncio.sleep(0)


async def holding() -> tuple[write_batch.WriteBatch, Transport, Transport]:
    """A batch after a turn that wrote to two connections: the next turn's writes are held."""
    batch = write_batch.of(asyncio.get_running_loop())
    a, b = Transport(), Transport()
    batch.write(a, b"1")  # type: ignore[arg-type]
    batch.write(b, b"x")  # type: ignore[arg-type]
    assert a.sent == [b"1"] and b.sent == [b"x"]  # that turn's own went straight out
    await next_turn()
    assert batch.holding
    return batch, a, b


def run(body):  # type: ignore[no-untyped-def]
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(body())
    finally:
        loop.close()


def test_one_connection_a_turn_writes_straight_through() -> None:
    async def body() -> None:
        batch = write_batch.of(asyncio.get_running_loop())
        a = Transport()
        for turn in range(3):
            batch.write(a, b"head%d" % turn)  # type: ignore[arg-type]
            batch.write(a, b"body%d" % turn)  # type: ignore[arg-type]
            assert a.sent[-2:] == [b"head%d" % turn, b"body%d" % turn]  # at once
            await next_turn()
            await next_turn()
        assert not batch.holding
    run(body)


def test_after_a_turn_with_two_connections_writes_are_held_one_turn_and_joined() -> None:
    async def body() -> None:
        batch, a, b = await holding()
        batch.write(a, b"2")  # type: ignore[arg-type]
        batch.write(b, b"y")  # type: ignore[arg-type]
        batch.write(a, b"3")  # type: ignore[arg-type]
        assert a.sent == [b"1"] and b.sent == [b"x"]  # held
        await next_turn()
        assert a.sent == [b"1", b"23"] and b.sent == [b"x", b"y"]  # one write each, in order
        assert batch.holding  # two connections again
    run(body)


def test_a_held_turn_with_one_connection_goes_back_to_straight_writes() -> None:
    async def body() -> None:
        batch, a, b = await holding()
        batch.write(a, b"2")  # type: ignore[arg-type]
        await next_turn()
        assert a.sent == [b"1", b"2"] and not batch.holding
        batch.write(a, b"3")  # type: ignore[arg-type]
        assert a.sent[-1] == b"3"
    run(body)


def test_a_closing_connection_sends_what_it_holds_first_and_a_gone_one_drops_it() -> None:
    async def body() -> None:
        batch, a, b = await holding()
        c = Transport()
        batch.write(a, b"last answer")  # type: ignore[arg-type]
        batch.write(b, b"cancelled request")  # type: ignore[arg-type]
        batch.write(c, b"z")  # type: ignore[arg-type]
        batch.flush(a)  # the server closes a: its answer goes first
        assert a.sent == [b"1", b"last answer"]
        b.closing = True  # the peer left meanwhile
        await next_turn()
        assert a.sent == [b"1", b"last answer"]  # not twice
        assert b.sent == [b"x"] and c.sent == [b"z"]
    run(body)


def test_a_connection_whose_write_fails_is_aborted_and_the_others_still_sent() -> None:
    async def body() -> None:
        batch, a, b = await holding()
        b.fails = True
        batch.write(b, b"y")  # type: ignore[arg-type]
        batch.write(a, b"2")  # type: ignore[arg-type]
        await next_turn()
        assert b.aborted and a.sent == [b"1", b"2"]
    run(body)


def test_each_event_loop_has_its_own_batch_which_goes_with_it() -> None:
    seen = []
    for _ in range(2):
        async def body() -> None:
            seen.append(write_batch.of(asyncio.get_running_loop()))
            assert write_batch.of(asyncio.get_running_loop()) is seen[-1]
        run(body)
    assert seen[0] is not seen[1]
    gc.collect()
    assert seen[0].loop() is None and seen[1].loop() is None  # nor kept by the batches
    assert not any(batch in seen for batch in write_batch._BATCHES.values())
