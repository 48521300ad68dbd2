"""The upstream client of production: HTTP/1.1 on asyncio Protocols, parsed by httptools.

aiohttp's per-request machinery was a fifth of the gateway's CPU for whole answers (issue 17).
Here a request is one pre-framed write (its request line and Host made once per URL), the
answer is parsed by httptools (uvicorn's parser) in `data_received`, and a reader waits on one
future per read. Connections are kept alive per host; one that breaks before the status line
after being reused is retried once on a fresh one (the worker closed it while idle), as aiohttp
does. Closing an answer with its body unfinished closes its connection: the worker aborts."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections import defaultdict
from urllib.parse import unquote, urlsplit

import httptools
from mypy_extensions import mypyc_attr

from adapters import base
from gateway import pump, upstream, write_batch
from schemas import errors

HIGH_WATER = 1 << 16  # body bytes buffered before the socket is paused (aiohttp's 64 KiB)
Origin = tuple[str, int, bool]  # host, port, tls


class Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time; the response parsed as it arrives."""

    def __init__(self, origin: Origin, pool: dict[Origin, list[Connection]] | None = None) -> None:
        self.origin = origin
        self.pool = pool  # the client's idle connections, which this one leaves when it closes
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        # held: on Python 3.11 each asyncio.get_running_loop() is a getpid() system call
        self.loop = asyncio.get_running_loop()
        self.batch = write_batch.of(self.loop)
        self.head: asyncio.Future[None] = self.loop.create_future()
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.framed = False  # a content-length or transfer-encoding header came
        self.interim = False  # a 1xx head is being parsed
        self.retry_after: str | None = None  # the answer's Retry-After, passed on with an error
        self.error: str | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.used = 0  # requests sent on this connection
        # takes the body in data_received; the class itself, not a protocol: the compiled
        # build calls its methods natively, once a chunk
        self.sink: pump.Pump | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the worker switched protocols")
        except httptools.HttpParserError as exc:
            self._fail(f"malformed HTTP from the worker ({exc})")
        if self.sink is not None:  # a relayed stream: one read per chunk of a paced stream
            self.pump()

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._leave_pool()
        if self.status and not self.framed and exc is None and not self.complete:
            self.complete = True  # a body without length ends with the connection (RFC 9112 6.3)
            self._wake()
        if not self.complete:
            self._fail(f"{type(exc).__name__}: {exc}" if exc else "the connection was closed")
        if self.sink is not None:
            self.pump()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.framed and name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True
        elif len(name) == 11 and name.lower() == b"retry-after":
            self.retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            # an interim answer (100 Continue, 103 Early Hints): the final one follows on the
            # same connection and is the answer (RFC 9110 section 15.2); its fields are dropped
            self.interim = True
            self.framed = False
            self.retry_after = None
            return
        self.status = status
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        if self.sink is not None:
            # the bytes go on at the end of this read (no reader waits meanwhile) and the sink
            # pauses reading itself while its client is full; a pause here would never be lifted
            return
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.interim:  # the end of an interim answer's head: the final one comes next
            self.interim = False
            return
        self.keep_alive = self.parser.should_keep_alive()  # reset once this callback returns
        self.complete = True
        self._wake()

    # ours
    def pump(self) -> None:
        """Hand what arrived to the sink: the bytes of this read as one piece (one batch of
        events, as one `read_chunk` would give), then the end or the failure."""
        sink = self.sink
        assert sink is not None
        chunks = self.chunks
        if chunks:  # `take`, spelled out: this runs once per read of a relayed stream
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            self.buffered = 0
            sink.data(data)
        if self.complete:
            self.sink = None
            sink.end(None)
        elif self.error is not None:
            self.sink = None
            sink.end(self.error)

    def take(self) -> bytes:
        """The body bytes buffered since the last take, as one piece."""
        data = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        return data

    def _leave_pool(self) -> None:
        """Out of the idle pool, and the origin too once it has none (a worker gone for good
        would otherwise keep its closed connections there forever)."""
        idle = self.pool.get(self.origin) if self.pool is not None else None
        if idle is None:
            return
        if self in idle:
            idle.remove(self)
        if not idle and self.pool is not None:
            del self.pool[self.origin]

    def _fail(self, why: str) -> None:
        if self.error is None:
            self.error = why
        if not self.head.done():
            self.head.set_exception(ConnectionError(why))
            # marked as seen: a connection can die with no request awaiting its head (closed
            # as it opened, or its connect cancelled after `connection_made`); `self.error`
            # keeps the reason, and a request that does await the head still gets it
            self.head.exception()
        self._wake()
        self.close()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def reusable(self) -> bool:
        return self.transport is not None and self.error is None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def prepare(self) -> None:
        """Ready for the next request on this connection."""
        self.status = self.buffered = 0
        self.head = self.loop.create_future()
        self.chunks.clear()
        self.complete = self.keep_alive = self.framed = self.interim = False
        self.retry_after = None
        self.used += 1
        if self.paused and self.transport is not None:  # a relay ended with reading paused
            self.paused = False
            self.transport.resume_reading()


class Http1Response:
    """An answer being read; `aclose` returns its connection to the pool or closes it."""

    __slots__ = ("_conn", "_pool", "retry_after", "status")

    def __init__(self, conn: Connection, pool: Http1Client):
        self._conn = conn
        self._pool = pool
        self.status = conn.status
        self.retry_after = conn.retry_after

    async def read_chunk(self) -> bytes:
        conn = self._conn
        while True:
            if conn.chunks:
                data = conn.take()
                self.resume_reading()
                return data
            if conn.complete:
                return b""
            if conn.error is not None:
                raise errors.UpstreamBroken(upstream.BROKE_OFF, detail=conn.error)
            conn.waiter = conn.loop.create_future()
            try:
                await conn.waiter
            finally:
                conn.waiter = None

    def attach(self, sink: pump.Pump) -> None:
        """From now on the body goes to `sink` from the connection's callbacks (what came
        already goes at once); `read_chunk` is not used meanwhile."""
        conn = self._conn
        conn.sink = sink
        self.resume_reading()
        if conn.chunks or conn.complete or conn.error is not None:
            conn.pump()

    def detach(self) -> None:
        self._conn.sink = None

    def pause_reading(self) -> None:
        conn = self._conn
        if not conn.paused and conn.transport is not None:
            conn.paused = True
            conn.transport.pause_reading()

    def resume_reading(self) -> None:
        conn = self._conn
        if conn.paused and conn.transport is not None:
            conn.paused = False
            conn.transport.resume_reading()

    async def read(self) -> bytes:
        conn = self._conn
        if conn.complete and not conn.paused:  # it came whole with its head: no reads to wait
            return conn.take() if conn.chunks else b""
        parts = []
        while data := await self.read_chunk():
            parts.append(data)
        return b"".join(parts)

    async def aclose(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        """`aclose` without a coroutine: closing never waits here, so the pipeline calls this
        directly where it would otherwise shield a task around `aclose` (a task per request
        was 3 % of a whole answer's CPU in the issue 17 profiles)."""
        conn = self._conn
        if conn.complete and conn.keep_alive and conn.reusable():
            self._pool.release(conn)
        else:
            conn.close()


@mypyc_attr(allow_interpreted_subclasses=True)  # tests and bench/wire_inproc.py replace parts
class Http1Client:
    """Keep-alive connections per origin, unlimited in number, like the aiohttp connector it
    replaces; created inside the running loop."""

    def __init__(self, connect_timeout: float):
        self.connect_timeout = connect_timeout
        self.idle: defaultdict[Origin, list[Connection]] = defaultdict(list)
        self._targets: dict[str, tuple[Origin, bytes, bytes]] = {}
        self._tls: ssl.SSLContext | None = None

    def target(self, url: str) -> tuple[Origin, bytes, bytes]:
        """(origin, path, header lines) of a URL, parsed once per URL; a URL no request can
        go to is a permanent error, tried once (issue 12), as `upstream.map_errors` says.
        The lines are Host and `accept-encoding: identity`: without it any coding is
        acceptable (RFC 9110 12.5.3), and the decoders read the worker's bytes as they are.
        Userinfo (`http://user:pass@host`) is never part of Host (RFC 9110 section 7.2: its
        value is uri-host and port; 4.2.4: a sender MUST NOT generate userinfo in a field);
        it becomes Basic credentials (RFC 7617) sent to that worker only, as httpx, aiohttp
        and curl send a URL's userinfo."""
        known = self._targets.get(url)
        if known is None:
            try:
                parts = urlsplit(url)
                port = parts.port
            except ValueError as exc:
                raise errors.UpstreamError(upstream.BAD_URL,
                                           detail=f"{upstream.shown(url)}: {exc}") from None
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise errors.UpstreamError(upstream.BAD_URL, detail=upstream.shown(url))
            tls = parts.scheme == "https"
            port = port or (443 if tls else 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            userinfo, _, authority = parts.netloc.rpartition("@")
            lines = f"host: {authority}\r\naccept-encoding: identity\r\n".encode()
            if userinfo:
                lines += b"authorization: Basic %s\r\n" % base64.b64encode(
                    f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode())
            known = ((parts.hostname or "", port, tls), path.encode(), lines)
            if len(self._targets) < 4096:
                self._targets[url] = known
        return known

    async def send(self, req: base.UpstreamRequest) -> Http1Response:
        origin, path, lines = self.target(req.url)
        if "host" in req.headers:  # an address a DNS name stands for: the name's (resolver)
            lines = lines[lines.index(b"\n") + 1:]  # the URL's Host line is the first
        # latin-1: what the gateway passes on from its client (x-request-id, traceparent) was
        # read as latin-1, so the worker gets the client's bytes (RFC 9110 section 5.5)
        fields = b"".join([f"{k}: {v}\r\n".encode("latin-1") for k, v in req.headers.items()])
        wire = b"%s %s HTTP/1.1\r\n%s%scontent-length: %d\r\n\r\n%s" % (
            req.method.encode(), path, lines, fields, len(req.body), req.body)
        while True:
            conn = self._pooled(origin) or await self._connection(origin)
            reused = conn.used > 0
            conn.prepare()
            try:
                if conn.transport is None:  # closed as it opened: the worker going away
                    raise ConnectionError(conn.error or "the connection was closed")
                conn.batch.write(conn.transport, wire)
                await conn.head
                return Http1Response(conn, self)
            except ConnectionError as exc:
                conn.close()
                if reused and not conn.chunks and conn.status == 0:
                    continue  # the worker closed an idle connection: once more, on a new one
                raise errors.UpstreamUnavailable(upstream.UNREACHABLE, detail=str(exc)) from None
            except BaseException:  # cancelled (client gone, timeout): the worker must abort
                conn.close()
                raise

    def _pooled(self, origin: Origin) -> Connection | None:  # an idle one that can take a request
        idle = self.idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.reusable():
                return conn
        return None

    async def _connection(self, origin: Origin) -> Connection:
        host, port, tls = origin
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(origin, self.idle), host, port,
                    ssl=self._ssl() if tls else None,
                    server_hostname=host if tls else None)
        except (OSError, TimeoutError) as exc:
            what = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise errors.UpstreamUnavailable(upstream.UNREACHABLE, detail=what) from None
        return conn

    def _ssl(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def release(self, conn: Connection) -> None:
        self.idle[conn.origin].append(conn)

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        try:
            async with asyncio.timeout(timeout):
                resp = await self.send(base.UpstreamRequest(
                    "GET", url, b"", {"host": host} if host else {}))
                try:
                    await resp.read()
                finally:
                    resp.close_now()
            return resp.status, ""
        except errors.GatewayError as exc:
            return 0, exc.detail or exc.message
        except TimeoutError as exc:
            return 0, upstream.failure(exc, timeout)

    async def aclose(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()
