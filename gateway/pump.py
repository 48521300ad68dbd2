"""A stream relayed from inside the worker connection's own callback: no task wakes per chunk.

On the await path each chunk of a paced stream costs one wake-up of the request's task and a
pass through two async generators before its bytes are encoded and sent (the benchmark's
profile: most of a paced chunk's CPU besides the socket calls). When the worker's response can
call back with its bytes (`gateway.http1`: `attach`) and the client can take bytes without an
await (the gateway's own server: `write_body`), the decoder, the encoder and the client's
write run right in the worker connection's `data_received`, and the request's task sleeps
until the answer ends, fails, or the client is too slow to take more (then reading from the
worker pauses until the client drains). Same events, same bytes, same errors as the await path
(`Pipeline._relay`): a failure ends the pump with the exception the await path would raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from adapters import base
from gateway import deadline, upstream
from gateway.progress import Progress
from schemas import errors
from schemas import events as ev

# The client's side: takes a batch without waiting; False once it cannot take more for now.
Deliver = Callable[[list[ev.Event]], bool]
Drain = Callable[[], Awaitable[None]]


class Attachable(Protocol):
    """A worker response that can call back with its bytes (gateway.http1.Http1Response)."""

    def attach(self, sink: Pump) -> None: ...

    def detach(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Pump:
    """Relays one worker answer, after its first batch, from the connection's callbacks."""

    __slots__ = ("_dog", "_loop", "_time", "_wake", "decoder", "deliver", "full", "idle",
                 "outcome", "resp", "seen")

    def __init__(self, resp: Attachable, decoder: base.StreamDecoder, deliver: Deliver,
                 seen: Progress | None, idle: float):
        self._loop = asyncio.get_running_loop()
        self._time = self._loop.time  # bound once: read every chunk
        self.resp = resp
        self.decoder = decoder
        self.deliver = deliver
        self.seen = seen
        self.idle = idle
        self.full = False  # the client cannot take more: the worker is not read meanwhile
        self.outcome: BaseException | bool | None = None  # True: the answer ended well
        self._wake: asyncio.Future[None] | None = None
        # the worker's silence counts only while the client takes what comes
        self._dog = deadline.IdleWatchdog(self._loop, idle, self._went_silent)
        self._dog.waiting = True

    async def run(self, drain: Drain) -> None:
        """Until the answer ends; raises what ended it otherwise."""
        self.resp.attach(self)
        try:
            while self.outcome is None:
                if self.full:
                    await drain()
                    self.full = False
                    self._dog.last = self._loop.time()
                    self._dog.waiting = True
                    self.resp.resume_reading()
                    continue
                self._wake = self._loop.create_future()
                await self._wake
        finally:
            self._wake = None
            self._dog.cancel()
            self.resp.detach()
            if self.full:  # ended while the client was full: the connection reads again
                self.resp.resume_reading()
        if isinstance(self.outcome, BaseException):
            raise self.outcome

    # called by the worker connection
    def data(self, data: bytes) -> None:
        if self.outcome is not None:
            return
        self._dog.last = self._time()
        try:
            decoder = self.decoder
            out = decoder.feed(data)
            if out and (self.seen is None or self.seen.track(out)) and not self.deliver(out):
                self.full = True
                self._dog.waiting = False
                self.resp.pause_reading()
                self._signal()
            if decoder.failed:  # a bad event after those: it ends the answer now, not when
                decoder.close()  # the worker next writes (or the idle timeout fires)
        except Exception as exc:  # noqa: BLE001 - handed to the task, which raises it
            self._finish(exc)

    def end(self, error: str | None) -> None:
        if self.outcome is not None:
            return
        if error is not None:
            self._finish(errors.UpstreamBroken(upstream.BROKE_OFF, detail=error))
            return
        try:
            out = self.decoder.close()
            if out and (self.seen is None or self.seen.track(out)):
                self.deliver(out)
        except Exception as exc:  # noqa: BLE001
            self._finish(exc)
            return
        self._finish(True)

    # ours
    def _finish(self, outcome: BaseException | bool) -> None:
        self.outcome = outcome
        self._signal()

    def _signal(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _went_silent(self) -> None:
        if self.outcome is None:
            self._finish(errors.UpstreamTimeout(f"the worker sent nothing for {self.idle:g}s"))
