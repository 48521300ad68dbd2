"""One HTTP/1.1 request and its response on a connection of `gateway.http_server`: the body
as it arrives (ASGI `receive`), the response framed as it is sent (ASGI `send`), and the
callback that tells the endpoint its client went away."""

from __future__ import annotations

import asyncio
import random
import time
import urllib.parse
from collections.abc import Callable, MutableMapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, ClassVar, Final, Protocol

Message = MutableMapping[str, Any]

HIGH_WATER = 64 * 1024  # request body bytes buffered before reading pauses

_STATUS_LINES: dict[int, bytes] = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}
_CLOSE = b"connection: close\r\n"
_KEEP = b"connection: keep-alive\r\n"
_CHUNKED = b"transfer-encoding: chunked\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Each chunk's size line, made once: `b"%x\r\n%b\r\n" % (n, body)` was about 2,700
# instructions a streamed chunk in the compiled build (a generic `%`; bench/RESULTS.md §32).
_SIZE_LINES: Final[list[bytes]] = [b"%x\r\n" % n for n in range(4096)]


class Link(Protocol):
    """What a request needs of its connection (gateway.http_server.Connection)."""

    loop: asyncio.AbstractEventLoop
    writable: bool
    sockname: tuple[str, int] | None
    peername: tuple[str, int] | None

    @property
    def draining(self) -> bool: ...

    def write(self, data: bytes) -> bool:
        """Whether the client takes more now (False: `drain` first): `writable` after it."""

    async def drain(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def finished(self, cycle: Cycle) -> None: ...


class _Clock:
    """The `date` header, formatted once a second."""

    second: ClassVar[int] = 0
    line: ClassVar[bytes] = b""

    @classmethod
    def date(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second = now
            cls.line = b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return cls.line


def chunk(body: bytes) -> bytes:
    """`body` as one HTTP/1.1 chunk (RFC 9112 section 7.1)."""
    n = len(body)
    return (_SIZE_LINES[n] if n < 4096 else b"%x\r\n" % n) + body + b"\r\n"


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else f"HTTP/1.1 {status} \r\n".encode()


def new_id() -> str:
    """A random 128-bit id in 32 hex digits (request and response ids): as unique as
    uuid4().hex, at a twentieth of its cost (randbytes' hex is a third of formatting
    getrandbits(128)); randbytes' own body, spelled out (one Python call less)."""
    return _getrandbits(128).to_bytes(16, "little").hex()


_getrandbits = random.getrandbits  # random.randbytes(16) is getrandbits(128).to_bytes(16, "little")


def plain_response(status: int, text: str, request_id: bytes | None = None) -> bytes:
    """A whole plain-text answer that closes the connection (errors found while parsing). It
    carries an `x-request-id` as every answer does (SPEC.md): the client's when its head got
    that far, else a new one."""
    body = text.encode()
    rid = request_id or new_id().encode()
    return b"".join((status_line(status), _Clock.date(), _CLOSE,
                     b"content-type: text/plain; charset=utf-8\r\nx-request-id: %s\r\n" % rid,
                     b"content-length: %d\r\n\r\n" % len(body), body))


# Stands for a percent-encoded `/` inside one path segment while routes are matched: a path
# parameter may hold one (an Elastic inference id or a model name `org/model`, which
# elasticsearch-py sends as `org%2Fmodel`), as a server that splits the path before decoding
# it (Elasticsearch's RestUtils) reads it. U+FFFF is a noncharacter, in no real path.
ENCODED_SLASH = "\uffff"


def routing_path(raw: bytes, path: str) -> str:
    """The path routes are matched against: the decoded `path`, but with a slash that came
    percent-encoded in `raw` kept inside its segment (as ENCODED_SLASH)."""
    if b"%2f" not in raw.lower():
        return path
    return "/".join(urllib.parse.unquote(part).replace("/", ENCODED_SLASH)
                    for part in raw.decode("latin-1").split("/"))


class Cycle:
    """One request on a connection and its response: what an endpoint reads and writes
    (`gateway.peer.Peer`: path, headers, receive, send, on_disconnect)."""

    __slots__ = ("_lost_hook", "_waiter", "body", "body_done", "body_size", "chunked", "conn",
                 "cors_head", "delivered", "done", "head", "head_pending", "headers",
                 "http_version", "keep_alive", "lost", "method", "path", "path_params", "query",
                 "raw_headers", "raw_path", "relaying", "started", "status", "wants_continue")

    def __init__(self, conn: Link, method: str, raw_path: bytes, query: bytes,
                 raw_headers: list[tuple[bytes, bytes]], http_version: str, keep_alive: bool):
        self.conn = conn
        self.method = method
        self.raw_path = raw_path
        path = raw_path.decode("latin-1")
        self.path = urllib.parse.unquote(path) if "%" in path else path
        self.query = query
        self.raw_headers = raw_headers
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers}
        self.path_params: dict[str, str] = {}
        self.http_version = http_version
        self.keep_alive = keep_alive
        self.wants_continue = self.headers.get("expect", "").lower() == "100-continue"
        self.body: list[bytes] = []
        self.body_size = 0
        self.body_done = False
        self.delivered = False  # the body's last message went to the app
        self._waiter: asyncio.Future[None] | None = None
        self._lost_hook: Callable[[], None] | None = None
        self.lost = False  # the client went away
        self.started = False  # http.response.start received
        self.head: list[tuple[bytes, bytes]] = []
        self.head_pending = False
        self.status = 0
        self.chunked = False
        self.done = False  # the response's last byte is written
        # the head is out, the body goes in chunks and the client is here: `write_body`'s
        # middle chunks take the short way (one per chunk of a stream)
        self.relaying = False
        self.cors_head = b""  # CORS header lines of the answer (gateway.cors), set by the server

    # ---------------------------------------------------------------- request side

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def on_body(self, data: bytes) -> None:
        self.body.append(data)
        self.body_size += len(data)
        if self.body_size > HIGH_WATER:
            self.conn.pause_reading()
        self._wake()

    def on_complete(self) -> None:
        self.body_done = True
        self._wake()

    def on_lost(self) -> None:
        self.lost = True
        self.relaying = False
        self._wake()
        hook, self._lost_hook = self._lost_hook, None
        if hook is not None:
            hook()

    def on_disconnect(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call `fn` once if the client goes away before the hook is removed (the returned
        function removes it)."""
        if self.lost:
            fn()
            return self._unhook
        self._lost_hook = fn
        return self._unhook

    def _unhook(self) -> None:
        self._lost_hook = None

    def ready_body(self, limit: int) -> bytes | None:
        """The whole body, taken as `receive` takes it, when it is all here (most bodies come
        with their head), not empty and within `limit` bytes: `receive` would return it at
        once, so the caller arms no deadline for it. None otherwise, and nothing is taken."""
        if self.lost or self.delivered or not self.body_done or not 0 < self.body_size <= limit:
            return None
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        self.body_size = 0
        self.delivered = True
        self.conn.resume_reading()
        return data

    async def receive(self) -> Message:
        """ASGI `receive`: the body as it arrives, then `http.disconnect` once the client is
        gone or the response is complete."""
        while True:
            if self.lost or (self.delivered and self.done):
                return {"type": "http.disconnect"}
            if not self.delivered and (self.body or self.body_done):
                data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
                self.body = []
                self.body_size = 0
                self.delivered = self.body_done
                self.conn.resume_reading()
                return {"type": "http.request", "body": data, "more_body": not self.body_done}
            if self.wants_continue and not self.started and not self.body_done:
                self.wants_continue = False
                self.conn.write(_CONTINUE)
            self._waiter = self.conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    # ---------------------------------------------------------------- response side

    async def send(self, message: Message) -> None:
        """ASGI `send`; the head waits for the first body bytes so both go in one write."""
        kind = message["type"]
        if kind == "http.response.body":
            await self._body(message.get("body", b""), message.get("more_body", False))
        elif kind == "http.response.start":
            if self.started:
                raise RuntimeError("the response has already started")
            self.started = self.head_pending = True
            self.status = message["status"]
            self.head = list(message.get("headers", ()))
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")

    async def _body(self, body: bytes, more: bool) -> None:
        if not self.write_body(body, more) and more:
            await self.conn.drain()

    def write_body(self, body: bytes, more: bool = True) -> bool:
        """Body bytes, framed, written now (the head with the first); False when the client
        is not taking bytes as fast as they come (await `drain` before more)."""
        if self.relaying and more and body:
            return self.conn.write(chunk(body))
        if not self.started:
            raise RuntimeError("a response body before its start")
        if self.done:
            raise RuntimeError("a response body after the response completed")
        if self.lost:
            if not more:
                self.done = True
            return True
        conn = self.conn
        if self.head_pending:
            self.head_pending = False
            out = [self._head_bytes(None if more else len(body))]
        else:
            out = []
        if self.method == "HEAD" or self.status in (204, 304):
            pass
        elif self.chunked:
            if body:
                out.append(chunk(body))
            if not more:
                out.append(_LAST_CHUNK)
            else:
                self.relaying = True
        elif body:
            out.append(body)
        if out:
            conn.write(out[0] if len(out) == 1 else b"".join(out))
        if not more:
            self.done = True
            self.relaying = False
            self._wake()
            conn.finished(self)
        return conn.writable

    async def drain(self) -> None:
        await self.conn.drain()

    def _head_bytes(self, length: int | None) -> bytes:
        """Status line and headers; framing from the app's headers, else Content-Length when
        the whole body is at hand, else chunked (HTTP/1.1) or close-delimited (HTTP/1.0)."""
        parts = [status_line(self.status)]
        framed = False
        for name, value in self.head:
            low = name.lower()
            if low == b"content-length":
                framed = True
            elif low == b"transfer-encoding":
                framed = self.chunked = b"chunked" in value.lower()
            elif low == b"connection":
                if b"close" in value.lower():
                    self.keep_alive = False
                continue  # written below, once
            parts += (name, b": ", value, b"\r\n")
        # the gateway's answers carry no CORS field and no Vary of their own: these lines are
        # what Starlette's CORSMiddleware would set or merge into them
        parts.append(self.cors_head)
        if not framed and self.status not in (204, 304) and self.status >= 200:
            if length is not None:
                parts.append(b"content-length: %d\r\n" % length)
            elif self.method == "HEAD":
                pass
            elif self.http_version == "1.1":
                parts.append(_CHUNKED)
                self.chunked = True
            else:
                self.keep_alive = False  # the end of the body is the end of the connection
        if self.conn.draining or not self.body_done:
            # an answer given before the whole body came (a 413, a 408, a refused key): the
            # rest will not be read, so the connection cannot carry another request
            self.keep_alive = False
        parts.append(_Clock.date())
        if not self.keep_alive:
            parts.append(_CLOSE)
        elif self.http_version == "1.0":
            parts.append(_KEEP)
        parts.append(b"\r\n")
        return b"".join(parts)

    def scope(self) -> Message:
        """The ASGI scope of this request (the Starlette routes)."""
        conn = self.conn
        return {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": self.http_version, "server": conn.sockname, "client": conn.peername,
            "scheme": "http", "method": self.method, "root_path": "", "path": self.path,
            "raw_path": self.raw_path, "query_string": self.query, "headers": self.raw_headers,
            "state": {}, "extensions": {},
        }
