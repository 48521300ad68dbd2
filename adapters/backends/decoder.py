"""The framing half of every worker decoder, written once: SSE events, JSON lines or a whole JSON
body in, one parsed JSON object per event out to the worker's own `on_event`.

A worker decoder says only what a parsed event means (`on_event`, `on_body`, `on_end`); this
base reads the framing (adapters/framing.py), parses each event with one `orjson.loads`, and
orders failures the same way for every worker. A decoder that can read some events without
parsing them all (`fast`: OpenAI's text chunks, adapters/backends/text_slot.py) is offered
each event first (`on_payload`).

A failure found in a read (an in-band error event, malformed JSON, an event that is not a JSON
object) comes after the events that came before it in the same read: those are returned,
`failed` turns true, and the failure is raised on the next `feed` or at `close`, once. So what
a client receives does not depend on where the network cut the stream. A decoder that raised
is spent: later calls return nothing.

An event whose JSON is not the worker's shape (a choice, delta or usage that is not an object, a
field of the wrong type) makes a worker's hook raise a TypeError or the like: that is the worker's
malformed answer (UpstreamBroken, 502, and the upstream counted as failing), not a gateway bug.
The guard is one `try` around each read's events, free in CPython 3.11 while nothing raises.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

import orjson
from mypy_extensions import mypyc_attr

from adapters import framing
from schemas import errors
from schemas import events as ev

Framing = Literal["sse", "lines", "whole"]
# Final: the compiled build keeps it in a C static, where `orjson.loads` reads the module's
# attribute once an event.
_loads: Final = orjson.loads


# Stand-ins for the reader a framing does not use (never fed: `feed` and `close` go by framing).
_NO_SSE = framing.SseDecoder()
_NO_LINES = framing.LineDecoder()


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (setup.py); tests subclass it
class FramedDecoder:
    """Base of the worker decoders (StreamDecoder); subclasses override the `on_*` hooks."""

    # The payload that ends a stream (OpenAI's `data: [DONE]`), when the protocol has one.
    DONE: ClassVar[bytes | None] = None
    # Read an SSE event the worker left without its blank line at the end, instead of calling
    # the stream cut inside an event.
    FLUSH_TAIL: ClassVar[bool] = False
    NOT_OBJECT: ClassVar[str] = "the worker's event is not a JSON object"
    # What a hook raises on an event of the wrong shape (a str where an object belongs: `.get`).
    MALFORMED: ClassVar[tuple[type[Exception], ...]] = (AttributeError, TypeError, KeyError,
                                                        IndexError, ValueError)

    def __init__(self, framing_: Framing):
        self._framing = framing_
        # only the framing's own reader: a whole body (most requests) needs neither
        self._sse = framing.SseDecoder() if framing_ == "sse" else _NO_SSE
        self._lines = framing.LineDecoder() if framing_ == "lines" else _NO_LINES
        self._body: list[bytes] = []
        self._failure: errors.GatewayError | None = None
        self._spent = False
        self.failed = False  # a failure is held back for the next feed or close
        self.fast = False  # each event goes to `on_payload` first

    # -- what a worker decoder supplies -------------------------------------------------------

    def on_event(self, obj: dict[str, Any], out: list[ev.Event]) -> None:
        """One event of a stream, parsed; append its canonical events or raise."""
        raise NotImplementedError

    def on_done(self) -> None:
        """The `DONE` payload came."""

    def on_payload(self, payload: bytes, out: list[ev.Event]) -> bool:
        """An event read without parsing it all, where a worker decoder can (`fast`): True
        when it was, else it is parsed and goes to `on_event`."""
        return False

    def on_body(self, obj: Any, out: list[ev.Event]) -> None:
        """A whole (non-streaming) body, parsed: by default one event."""
        self.on_event(self.object(obj), out)

    def on_end(self) -> list[ev.Event]:
        """The stream ended where it should: the events still held, or raise if it was cut."""
        return []

    # -- StreamDecoder ------------------------------------------------------------------------

    def feed(self, data: bytes) -> list[ev.Event]:
        if self._spent:
            return self._spend()
        if self._framing == "sse":
            events = self._sse.feed(data)
        elif self._framing == "lines":
            events = [(b"", line) for line in self._lines.feed(data)]
        else:
            self._body.append(data)
            return []
        out: list[ev.Event] = []
        try:
            self._events(events, out)
        except errors.GatewayError as exc:
            if not out:
                self._spent = True
                raise
            self._failure = exc  # the events before it go out first
            self._spent = self.failed = True
        return out

    def close(self) -> list[ev.Event]:
        if self._spent:
            return self._spend()
        self._spent = True
        out: list[ev.Event] = []
        if self._framing == "whole":
            body = self.parse(b"".join(self._body))
            try:
                self.on_body(body, out)
            except self.MALFORMED as exc:
                raise malformed(exc) from None
            return out + self.on_end()
        reader = self._sse if self._framing == "sse" else self._lines
        if self.FLUSH_TAIL:
            self._events(self._tail(), out)
        elif reader.pending:
            raise errors.UpstreamBroken("the worker's stream ended inside an event")
        return out + self.on_end()

    # -- parts --------------------------------------------------------------------------------

    def _spend(self) -> list[ev.Event]:
        """Raise the deferred failure the first time; a spent decoder then answers nothing."""
        failure, self._failure = self._failure, None
        self.failed = False
        if failure is not None:
            raise failure
        return []

    def _tail(self) -> list[tuple[bytes, bytes]]:
        if self._framing == "sse":
            return self._sse.close()
        return [(b"", line) for line in self._lines.close()]

    def _events(self, events: list[tuple[bytes, bytes]], out: list[ev.Event]) -> None:
        """Each (name, data) event: one orjson.loads and the worker's `on_event`; the
        terminator is the one payload that is not JSON (as written, it is compared first: a
        failed orjson.loads costs about 4 us, its JSONDecodeError being built in Python)."""
        done = self.DONE
        fast = self.fast
        try:
            for _, payload in events:
                if payload == done:
                    self.on_done()
                    continue
                if fast and self.on_payload(payload, out):
                    continue
                try:
                    obj = _loads(payload)
                except orjson.JSONDecodeError:
                    if self.DONE is not None and payload.strip() == self.DONE:
                        self.on_done()
                        continue
                    raise errors.UpstreamBroken("the worker sent malformed JSON",
                                                detail=repr(payload[:200])) from None
                if type(obj) is not dict:
                    raise errors.UpstreamBroken(self.NOT_OBJECT)
                self.on_event(obj, out)
        except self.MALFORMED as exc:
            raise malformed(exc) from None

    def parse(self, body: bytes) -> Any:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        # RFC 8259 section 8.1: a parser may ignore a leading byte order mark, as Python's
        # json and httpx's `Response.json()` (so the OpenAI SDK) do; orjson refuses it. Tried
        # only after a failed parse: a right answer pays nothing for it.
        if body[:3] == framing.BOM:
            try:
                return orjson.loads(body[3:])
            except orjson.JSONDecodeError:
                pass
        raise errors.UpstreamBroken("the worker sent malformed JSON", detail=repr(body[:200]))

    def object(self, obj: Any) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise errors.UpstreamBroken(self.NOT_OBJECT)
        return obj


def malformed(exc: Exception) -> errors.UpstreamBroken:
    """A hook's TypeError (or the like) on an event of the wrong shape, as the worker's fault."""
    return errors.UpstreamBroken("the worker sent an event of the wrong shape",
                                 detail=f"{type(exc).__name__}: {exc}")
