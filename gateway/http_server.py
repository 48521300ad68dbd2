"""The gateway's own HTTP/1.1 server: one asyncio Protocol per connection, parsed by httptools.

Why not uvicorn: the benchmark's profile put a quarter of a paced chunk and a third of a whole
answer in the ASGI server's per-request and per-send machinery (scope building, header checks
on every send, a task per request watching for the disconnect). Here a request's head is one
dict, the response head is written together with its first body bytes, a chunk is one write,
and a client that goes away cancels its request through a callback, not a watcher task.

Inference and status routes are called with the request itself (a `gateway.peer.Peer`): fixed
paths from `FastPaths.native`, path-parameter routes by `FastPaths.match` (Starlette's own
matching); everything else (404/405, /metrics) goes to the Starlette app as plain ASGI.
Behaviour at the wire: keep-alive and pipelining (requests answered in order), `Expect:
100-continue`, chunked and Content-Length bodies (both at once: 400; another transfer coding:
501), HTTP/1.0 (close-delimited streams), HEAD, a 505 for any other version, a 400 for an
HTTP/1.1 request without exactly one Host, a 414 for a request target past `MAX_URL_BYTES`, a
431 for a head past `MAX_HEAD_BYTES`, a field past `MAX_FIELD_BYTES` or more than `MAX_HEADERS`
fields, a 408 for a head not in within `timeouts.request_read`, an idle keep-alive connection
closed after `timeouts.keep_alive`, and writes that wait for a slow reader (transport flow
control) instead of buffering without bound. Nothing after a request that ends the connection
is read as a request (RFC 9112 section 9.6), and bytes that do not parse never cut an answer
under way: it is finished first, then the 400. The end of the client's bytes (a FIN: a close,
or only `shutdown(SHUT_WR)`, which TCP cannot tell apart) is the client gone: its answer is
dropped and the worker aborted at once (SPEC.md), as uvicorn, nginx and hyper's default do.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol, cast

import httptools

from gateway import cors, deadline, observability, write_batch
from gateway.http_cycle import Cycle, new_id, plain_response, routing_path

Message = MutableMapping[str, Any]

MAX_HEAD_BYTES = 64 * 1024  # request line and headers; past it: 431
# The request target alone; past it: 414 (RFC 9110 section 15.5.15). 8 KiB, as nginx's
# large_client_header_buffers and Apache's LimitRequestLine (8190) default to.
MAX_URL_BYTES = 8 * 1024
# Header fields in one head; past it: 431 (RFC 6585 section 5). hyper's server, TGI's,
# refuses more than 100 (src/proto/h1/role.rs DEFAULT_MAX_HEADERS) with 431 too.
MAX_HEADERS = 100
# One header field (name and value); past it: 431. Node's http server refuses a head past
# 16 KiB (--max-http-header-size) with 431; h11 (uvicorn's parser) gives up past 16 KiB too
# (max_incomplete_event_size, error_status_hint 431).
MAX_FIELD_BYTES = 16 * 1024


class _Refused(Exception):
    """A request head refused before it reaches a route: the status and text it is answered."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


Endpoint = Callable[[Cycle], Awaitable[None]]


class Host(Protocol):
    """What connections share (gateway.listener.Server)."""

    connections: set[Connection]
    native: dict[tuple[str, str], Endpoint]
    head_timeout: float
    keep_alive_timeout: float
    draining: bool
    cors: cors.Policy | None  # server.cors; None: off

    async def app(self, scope: Message, receive: Any, send: Any) -> None: ...

    def match(self, method: str, path: str) -> tuple[Endpoint, dict[str, Any]] | None: ...


class Connection(asyncio.Protocol):
    """One client connection: parses requests, serves them one at a time in arrival order."""

    def __init__(self, server: Host):
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.batch = write_batch.of(self.loop)
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.sockname: tuple[str, int] | None = None
        self.peername: tuple[str, int] | None = None
        self.current: Cycle | None = None  # the request being answered
        self.parsing: Cycle | None = None  # the request whose body is arriving
        self.queued: deque[Cycle] = deque()  # pipelined requests waiting their turn
        self.task: asyncio.Task[None] | None = None
        self.writable = True
        self._drained: asyncio.Future[None] | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._hosts = 0  # Host header lines in the head being parsed
        self._coded = False  # it names a transfer coding other than chunked
        self._framed = False  # it has a Transfer-Encoding field
        self._timer: deadline.Timeouts | None = None  # the one this connection is armed in
        self._paused = self._closed = self._heading = False  # _heading: a head not yet whole
        self._upgraded = False  # the parser stopped at an Upgrade request (we do not follow)
        self._ended = False  # no more requests are parsed: upgraded, a final one, a bad one
        self._refusal: bytes | None = None  # sent, then the close, once the answers are done
        self._raw_left = 0  # that request's body bytes still to come

    # ---------------------------------------------------------------- transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.sockname = _address(transport.get_extra_info("sockname"))
        self.peername = _address(transport.get_extra_info("peername"))
        self.server.connections.add(self)
        self._arm(self.server.keep_alive_timeout, self._idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        self._disarm()
        if self.current is not None:
            self.current.on_lost()
        for waiting in self.queued:
            waiting.on_lost()
        self.queued.clear()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._ended:
            if self._upgraded:
                self._after_upgrade(data)
            return  # RFC 9112 section 9.6: nothing after a final request is processed
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # Not a protocol we speak (`curl --http2` asks for h2c): the request is answered
            # over HTTP/1.1 and the connection closed after it. The parser takes what follows
            # the head for the new protocol; a body the request declared is still its body.
            self._upgraded = self._ended = True
            self._after_upgrade(data[exc.args[0]:])
        except httptools.HttpParserCallbackError as exc:
            if isinstance(refused := exc.__context__, _Refused):
                self._reject(refused.status, refused.text)
            else:  # a request target no URL parser takes, say
                self._reject(400, "Invalid HTTP request received.", repr(exc.__context__))
        except httptools.HttpParserError as exc:
            self._reject(400, "Invalid HTTP request received.", str(exc))
        if self._heading and self._timer is None:  # a head cut by its first read: its deadline
            self._arm(self.server.head_timeout, self._head_timeout)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        if not self.writable and not self._closed:
            self._drained = self.loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None

    # ---------------------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_size = 0
        self._hosts = 0
        self._coded = self._framed = False
        self._heading = True  # most heads are whole in one read: no deadline armed for them
        self._disarm()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if len(self._url) > MAX_URL_BYTES:
            raise _Refused(414, "URI Too Long")

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + 4
        self._head_size += size
        if (self._head_size > MAX_HEAD_BYTES or size > MAX_FIELD_BYTES
                or len(self._headers) >= MAX_HEADERS):
            raise _Refused(431, "Request header fields too large")
        if self.parsing is not None:
            return  # a chunked body's trailer field: never merged into the head (RFC 9110 6.5.1)
        low = name.lower()
        if low == b"host":
            self._hosts += 1
        elif low == b"transfer-encoding":
            self._framed = True
            if value.strip().lower() != b"chunked":
                self._coded = True  # gzip, identity, ...: chunked is the only coding read here
        self._headers.append((low, value))

    def on_headers_complete(self) -> None:
        self._heading = False
        self._disarm()
        parser = self.parser
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            # RFC 9110 section 15.6.6: llhttp passes `HTTP/2.0` and `HTTP/0.9` request lines,
            # which no client of HTTP/1.x framing sends; they are not served as HTTP/1.0
            raise _Refused(505, "HTTP Version Not Supported")
        if self._hosts != 1 or self._coded:
            self._check_head()
        url: Any = httptools.parse_url(self._url)  # Any: an absent part is None, not bytes
        # RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing
        # (a 1.0 hop may not know chunked): answered, then the connection closed
        keep = parser.should_keep_alive() and not (self._framed and version == "1.0")
        cycle = Cycle(self, parser.get_method().decode("ascii"), url.path or b"/",
                      url.query or b"", self._headers, version, keep and not self.server.draining)
        self.parsing = cycle
        if self.current is None:
            self._start(cycle)
        else:  # pipelined: answered after the one before it; stop reading meanwhile
            self.queued.append(cycle)
            self.pause_reading()

    def _check_head(self) -> None:
        # RFC 9112 section 6.1: a transfer coding the server does not understand SHOULD get 501
        if self._coded:
            raise _Refused(501, "Transfer coding not implemented")
        # RFC 9112 section 3.2: MUST 400 an HTTP/1.1 request without Host or with more than one
        if self._hosts > 1 or self.parser.get_http_version() != "1.0":
            raise _Refused(400, "A request needs exactly one Host header")

    def on_body(self, body: bytes) -> None:
        if self.parsing is not None:
            self.parsing.on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.parsing
        if cycle is None:
            return
        if self.parser.should_upgrade():
            cycle.keep_alive = False
            length = cycle.headers.get("content-length", "")
            self._raw_left = int(length) if length.isdigit() else 0
            if self._raw_left:
                return  # the body comes after the head as "upgraded" bytes
        cycle.on_complete()
        self.parsing = None
        if not cycle.keep_alive:
            self._ended = True  # the last request on this connection (Connection: close, 1.0)

    def _after_upgrade(self, data: bytes) -> None:
        """Bytes after a head asking for another protocol: the declared body, then nothing."""
        cycle = self.parsing
        if cycle is None or not self._raw_left:
            return
        body = data[:self._raw_left]
        self._raw_left -= len(body)
        if body:
            cycle.on_body(body)
        if not self._raw_left:
            cycle.on_complete()
            self.parsing = None

    # ---------------------------------------------------------------- serving

    def _start(self, cycle: Cycle) -> None:
        self.current = cycle
        self.task = self.loop.create_task(self._serve(cycle))

    async def _serve(self, cycle: Cycle) -> None:
        try:
            if (policy := self.server.cors) is not None and policy.preflight_of(cycle):
                return await cors.answer_preflight(policy, cycle)  # before any route or key
            endpoint = self.server.native.get((cycle.method, cycle.path))
            if endpoint is None and (found := self.server.match(
                    cycle.method, routing_path(cycle.raw_path, cycle.path))):
                endpoint, cycle.path_params = found
            if endpoint is not None:
                await endpoint(cycle)
            else:
                await self.server.app(cycle.scope(), cycle.receive, cycle.send)
        except Exception as exc:  # the endpoints answer their own errors; this is a bug
            observability.log_bug(cycle.headers.get("x-request-id", ""), exc)
            if not cycle.started and not cycle.lost:
                self.write(plain_response(500, "Internal Server Error",
                                          cycle.headers.get("x-request-id", "").encode("latin-1")))
            cycle.done = True
            self.close()
            return
        if not cycle.done:  # the app returned without finishing its answer
            if not cycle.started and not cycle.lost:
                self.write(plain_response(500, "Internal Server Error",
                                          cycle.headers.get("x-request-id", "").encode("latin-1")))
            cycle.done = True
            self.close()

    def finished(self, cycle: Cycle) -> None:
        """The response's last bytes are written: the next request, or close."""
        if cycle is not self.current:
            return
        self.current = None
        self.task = None
        if not cycle.keep_alive or not cycle.body_done or self.server.draining:
            self.close()  # an unread body (a refusal before reading it) ends the connection
            return
        if self.queued:
            self._start(self.queued.popleft())
            self.resume_reading()  # its body may still be on the way
            return
        if self._refusal is not None:  # the bytes after the requests answered did not parse
            self.write(self._refusal)
            self.close()
            return
        self.resume_reading()
        self._arm(self.server.keep_alive_timeout, self._idle_timeout)

    @property
    def draining(self) -> bool:
        return self.server.draining

    def idle(self) -> bool:
        return self.current is None

    def write(self, data: bytes) -> bool:
        if self.transport is not None and not self._closed:
            self.batch.write(self.transport, data)
        return self.writable

    def close(self) -> None:
        if self.transport is not None and not self._closed:
            self._closed = True
            self.batch.flush(self.transport)
            self.transport.close()

    def pause_reading(self) -> None:
        if not self._paused and self.transport is not None and not self._closed:
            self._paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._paused and self.transport is not None and not self._closed:
            self._paused = False
            self.transport.resume_reading()

    def _reject(self, status: int, text: str, reason: str = "") -> None:
        """A request that cannot be parsed: nothing more is parsed; answered now when no answer
        is under way, else after the requests before it (RFC 9112 9.3.2), then the connection
        closes; ignored after a final request (9.6). Its log line names its answer's id."""
        if self._ended:
            return
        self._ended = True  # not paused: a client that goes away must still be seen
        cycle, broken = self.current, self.parsing
        self.parsing = None
        # the refused head's own fields, as far as they were read (on_message_begin reset them)
        rid = next((v for k, v in self._headers if k == b"x-request-id"), None) \
            or new_id().encode()
        observability.logger().warning("invalid_http_request", request_id=rid.decode("latin-1"),
                                       status=status, reason=reason or text,
                                       client=_client(self.peername))
        if cycle is None or (broken is cycle and not cycle.started):
            self.write(plain_response(status, text, rid))
            self.close()
        elif broken is not cycle:  # a later request: refused in its turn; a queued one with it
            if broken is not None:
                self.queued.remove(broken)
            self._refusal = plain_response(status, text, rid)
        # else the answer under way (given before its whole body came) ends the connection

    def _arm(self, delay: float, fn: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel(self)
        self._timer = deadline.timeouts(self.loop, delay)
        self._timer.arm(self, fn)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel(self)
            self._timer = None

    def _idle_timeout(self) -> None:
        if self.current is None:
            self.close()

    def _head_timeout(self) -> None:
        if self.current is not None:  # a pipelined head: its turn comes after this answer
            self._arm(self.server.head_timeout, self._head_timeout)
        else:
            self._reject(408, "Request timeout")


def _address(addr: Any) -> tuple[str, int] | None:
    return (str(addr[0]), int(addr[1])) if isinstance(addr, tuple) and len(addr) >= 2 else None


def _client(addr: tuple[str, int] | None) -> str | None:
    return f"{addr[0]}:{addr[1]}" if addr else None
