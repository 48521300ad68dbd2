"""gateway.pump: a stream relayed from the worker connection's callbacks gives the same batches,
ends and failures as the await path, and never leaves the worker connection paused."""

from __future__ import annotations

import asyncio
import gc

import pytest

from adapters.backends import vllm
from gateway import deadline, pump
from gateway.progress import Progress
from schemas import canonical, errors
from schemas import events as ev


class LineDecoder:
    """One TextDelta per line; `close` fails when the last line was not `END`."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed = False

    def feed(self, data: bytes) -> list[ev.Event]:
        out: list[ev.Event] = []
        for line in data.decode().splitlines():
            self.lines.append(line)
            if line != "END":
                out.append(ev.TextDelta(0, line))
        return out

    def close(self) -> list[ev.Event]:
        if not self.lines or self.lines[-1] != "END":
            raise errors.UpstreamBroken("the worker's answer broke off")
        return [ev.Finish(0, "stop")]


class FakeResponse:
    """The worker side: records what the pump asks of the connection."""

    def __init__(self, already: list[bytes] | None = None) -> None:
        self.sink: pump.Pump | None = None
        self.paused = False
        self.already = already or []
        self.calls: list[str] = []

    def attach(self, sink: pump.Pump) -> None:
        self.sink = sink
        for data in self.already:  # what came before the pump: handed over at once
            sink.data(data)

    def detach(self) -> None:
        self.sink = None

    def pause_reading(self) -> None:
        self.paused = True
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.paused = False
        self.calls.append("resume")


def texts(batches: list[list[ev.Event]]) -> list[list[str]]:
    return [[e.text if isinstance(e, ev.TextDelta) else type(e).__name__ for e in b]
            for b in batches]


async def drained() -> None:
    await asyncio.sleep(0)


@pytest.mark.anyio
async def test_batches_per_read_then_the_end() -> None:
    got: list[list[ev.Event]] = []
    resp = FakeResponse([b"a\nb\n"])
    p = pump.Pump(resp, LineDecoder(), lambda b: got.append(b) or True, None, idle=5)
    task = asyncio.ensure_future(p.run(drained))
    await asyncio.sleep(0)
    assert resp.sink is p
    p.data(b"c\n")
    p.data(b"END\n")
    p.end(None)
    await asyncio.wait_for(task, 1)
    assert texts(got) == [["a", "b"], ["c"], ["Finish"]]
    assert resp.sink is None and not resp.paused


@pytest.mark.anyio
async def test_a_broken_connection_raises_upstream_broken() -> None:
    resp = FakeResponse()
    p = pump.Pump(resp, LineDecoder(), lambda b: True, None, idle=5)
    task = asyncio.ensure_future(p.run(drained))
    await asyncio.sleep(0)
    p.data(b"a\n")
    p.end("ConnectionResetError: reset by peer")
    with pytest.raises(errors.UpstreamBroken) as caught:
        await asyncio.wait_for(task, 1)
    assert caught.value.detail == "ConnectionResetError: reset by peer"


@pytest.mark.anyio
async def test_an_unfinished_answer_fails_as_the_decoder_says() -> None:
    resp = FakeResponse([b"a\n"])
    p = pump.Pump(resp, LineDecoder(), lambda b: True, None, idle=5)
    task = asyncio.ensure_future(p.run(drained))
    await asyncio.sleep(0)
    p.end(None)  # the body ended without END
    with pytest.raises(errors.UpstreamBroken):
        await asyncio.wait_for(task, 1)


@pytest.mark.anyio
async def test_a_full_client_pauses_the_worker_until_it_drains() -> None:
    drains: list[int] = []
    resp = FakeResponse()

    async def drain() -> None:
        drains.append(1)
        assert resp.paused  # the worker is not read while the client is full
        await asyncio.sleep(0)

    p = pump.Pump(resp, LineDecoder(), lambda b: False, None, idle=5)
    task = asyncio.ensure_future(p.run(drain))
    await asyncio.sleep(0)
    p.data(b"a\n")
    for _ in range(5):
        await asyncio.sleep(0)
    assert drains and not resp.paused and resp.calls == ["pause", "resume"]
    p.data(b"END\n")
    p.end(None)
    await asyncio.wait_for(task, 1)


@pytest.mark.anyio
async def test_ending_while_the_client_is_full_leaves_the_worker_readable() -> None:
    """The answer's end can come in the very read that filled the client: the pooled worker
    connection must not go back to the pool paused (its next request would never be read)."""
    resp = FakeResponse()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def drain() -> None:
        await never  # the client never drains

    p = pump.Pump(resp, LineDecoder(), lambda b: False, None, idle=5)
    task = asyncio.ensure_future(p.run(drain))
    await asyncio.sleep(0)
    p.data(b"a\nEND\n")  # fills the client
    p.end(None)  # and the answer ends in the same read
    await asyncio.wait_for(task, 1)
    assert not resp.paused and resp.calls[-1] == "resume"


@pytest.mark.anyio
async def test_a_silent_worker_times_out() -> None:
    resp = FakeResponse([b"a\n"])
    p = pump.Pump(resp, LineDecoder(), lambda b: True, None, idle=0.05)
    with pytest.raises(errors.UpstreamTimeout):
        await asyncio.wait_for(p.run(drained), 2)
    assert resp.sink is None


@pytest.mark.anyio
async def test_what_the_pump_delivers_is_tracked_for_a_failover() -> None:
    """gateway.progress.Progress notes each batch on its way out (the text a continuation
    would carry on), the end's too."""
    got: list[list[ev.Event]] = []
    seen = Progress(1)
    resp = FakeResponse([b"a\nb\n"])
    p = pump.Pump(resp, LineDecoder(), lambda b: got.append(b) or True, seen, idle=5)
    task = asyncio.ensure_future(p.run(drained))
    await asyncio.sleep(0)
    p.data(b"END\n")
    p.end(None)
    await asyncio.wait_for(task, 1)
    assert texts(got) == [["a", "b"], ["Finish"]]
    assert seen.texts == [["a", "b"]] and seen.tokens == [2] and seen.finished == [True]


@pytest.mark.anyio
async def test_a_bad_event_after_good_ones_in_one_read_ends_the_answer_at_once() -> None:
    """vLLM's decoder holds a malformed event back behind the text before it in the same read
    (adapters/backends/decoder.py); the pump raises it right after delivering that text, not
    when the worker next writes or the idle timeout fires."""
    req = canonical.InferenceRequest(model="m", messages=[canonical.Message("user", "hi")],
                                     stream=True)
    chunk = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
             b'"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n')
    got: list[list[ev.Event]] = []
    resp = FakeResponse()
    p = pump.Pump(resp, vllm.VllmBackend().decoder(req, streaming=True),
                  lambda b: got.append(b) or True, None, idle=30)
    task = asyncio.ensure_future(p.run(drained))
    await asyncio.sleep(0)
    p.data(chunk + b"data: {not json\n\n")  # and the worker says nothing more
    with pytest.raises(errors.UpstreamBroken, match="malformed JSON"):
        await asyncio.wait_for(task, 1)
    assert texts(got) == [["Hi"]]


@pytest.mark.anyio
async def test_an_ended_pump_is_freed_without_the_garbage_collector() -> None:
    """Its watchdog's callback is bound to it: kept past the end, that cycle (and the decoder,
    encoder and exchange hanging off the pump) waits for a collection, whose cost grows with
    every stream in flight (bench/RESULTS.md section 23)."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        resp = FakeResponse([b"a\n"])
        p = pump.Pump(resp, LineDecoder(), lambda b: True, None, idle=5)
        task = asyncio.ensure_future(p.run(drained))
        await asyncio.sleep(0)
        p.data(b"END\n")
        p.end(None)
        await asyncio.wait_for(task, 1)
        del p, task, resp
        gc.collect()
        assert not [o for o in gc.garbage if isinstance(o, pump.Pump | deadline.IdleWatchdog)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
