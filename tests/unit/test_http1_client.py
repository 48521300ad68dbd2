"""The Protocol-based upstream client against small scripted HTTP/1.1 servers on loopback:
keep-alive reuse, chunked bodies read as they come, a stale idle connection retried once,
unfinished bodies and cancellations closing the connection (the worker aborts), breaks and
refusals mapped to the gateway's errors, and reading paused while the reader lags."""

from __future__ import annotations

import asyncio
import base64
import gc
import socket
from collections.abc import Awaitable, Callable

import pytest

from adapters import base
from gateway import http1, pump, upstream
from schemas import errors

pytestmark = pytest.mark.anyio
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class Server:
    """A loopback server running `handler` per connection; counts connections and EOFs."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.connections = 0
        self.eofs = 0
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> str:
        async def run(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            self.connections += 1
            task = asyncio.current_task()
            assert task is not None
            self.handlers.add(task)
            try:
                await self.handler(r, w)
            except asyncio.CancelledError:
                # ended by __aexit__; a handler task that ends cancelled makes 3.11's
                # StreamReaderProtocol log "Exception in callback" (it asks its exception())
                pass
            finally:
                w.close()
                self.handlers.discard(task)

        self.server = await asyncio.start_server(run, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        """Closed, and its handlers still running (a worker that keeps its connection open)
        ended here, not cancelled as the test's loop closes."""
        assert self.server is not None
        self.server.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)

    async def until_eof(self, r: asyncio.StreamReader) -> None:
        """Wait (bounded) for the client to close: what a worker sees as an abort."""
        async with asyncio.timeout(5):
            while await r.read(65536):
                pass
        self.eofs += 1
        self.closed.set()


async def read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head + await r.readexactly(length)


def answers_once(raw: bytes) -> Handler:
    """A worker that reads one request, writes `raw` and closes the connection."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(raw)
        await w.drain()

    return handler


def answers_in_turn(answers: list[bytes]) -> Handler:
    """A worker that answers each request on its connection with the next of `answers`, each
    in one write (on loopback, one read: the head and the whole body)."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for raw in answers:
            await read_request(r)
            w.write(raw)

    return handler


def post(url: str, body: bytes = b"{}") -> base.UpstreamRequest:
    return base.UpstreamRequest("POST", url + "/v1/chat/completions", body,
                                {"content-type": "application/json", "x-request-id": "r1"})


async def test_keep_alive_reuses_one_connection_and_frames_the_request() -> None:
    seen: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while not r.at_eof():
            try:
                seen.append(await read_request(r))
            except asyncio.IncompleteReadError:
                return
            w.write(OK)

    srv = Server(handler)
    async with srv as url:
        client = http1.Http1Client(2.0)
        for _ in range(3):
            resp = await client.send(post(url, b'{"a":1}'))
            assert resp.status == 200 and await resp.read() == b"ok"
            await resp.aclose()
        await client.aclose()
    assert srv.connections == 1
    port = url.rsplit(":", 1)[1]
    assert seen[0] == (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:" + port.encode()
                       + b"\r\naccept-encoding: identity"  # no compressed answers, RFC 9110 12.5.3
                       + b"\r\ncontent-type: application/json\r\nx-request-id: r1\r\n"
                         b"content-length: 7\r\n\r\n{\"a\":1}")


async def test_a_body_here_whole_with_its_head_reads_as_every_piece_joined() -> None:
    """`read` takes a body that came whole with its head (a chunked one in several `on_body`
    pieces, an empty one) without waiting on a read: the same bytes as reading it piece by
    piece, and the connection goes back to the pool. Framing as RFC 9112 sections 6.3 and 7.1
    (a zero-length Content-Length body; chunks, then the last chunk)."""
    answers = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n2\r\nde\r\n1\r\nf\r\n0\r\n\r\n",
               b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"]

    srv = Server(answers_in_turn(answers))
    async with srv as url:
        client = http1.Http1Client(2.0)
        bodies = []
        for _ in answers:
            resp = await client.send(post(url))
            async with asyncio.timeout(5):
                while not resp._conn.complete:
                    await asyncio.sleep(0)
            bodies.append(await resp.read())
            resp.close_now()
        await client.aclose()
    assert bodies == [b"abcdef", b""]
    assert srv.connections == 1


async def test_a_clients_request_id_reaches_the_worker_byte_for_byte() -> None:
    """The gateway reads its client's fields as latin-1 (obs-text, RFC 9110 section 5.5); the
    x-request-id it passes on is the client's bytes, not their UTF-8 re-encoding."""
    seen: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        seen.append(await read_request(r))
        w.write(OK)

    async with Server(handler) as url:
        client = http1.Http1Client(2.0)
        req = post(url)
        req.headers["x-request-id"] = b"caf\xe9-\xff".decode("latin-1")
        resp = await client.send(req)
        await resp.read()
        await resp.aclose()
        await client.aclose()
    assert b"\r\nx-request-id: caf\xe9-\xff\r\n" in seen[0]



async def test_a_host_header_given_replaces_the_urls_host() -> None:
    """An address a DNS name was expanded to is asked with the name's Host (gateway.resolver):
    one Host line, the name's, never a second one (RFC 9112 section 3.2: a request with more
    than one Host is a 400)."""
    heads: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        heads.append(await read_request(r))
        w.write(OK)
        await w.drain()

    async with Server(handler) as url:
        client = http1.Http1Client(2.0)
        req = post(url)
        req.headers["host"] = "vllm.internal:8000"
        resp = await client.send(req)
        assert await resp.read() == b"ok"
        await resp.aclose()
        await client.aclose()
    hosts = [line for line in heads[0].split(b"\r\n") if line.lower().startswith(b"host:")]
    assert hosts == [b"host: vllm.internal:8000"]


async def test_userinfo_is_basic_credentials_to_that_worker_never_part_of_host() -> None:
    """RFC 9110 section 7.2: Host is uri-host and port; 4.2.4: a sender MUST NOT put userinfo
    in a field value. A base URL's `user:pass@` is sent as Basic credentials (RFC 7617), as
    httpx (httpx/_urls.py, _auth.py), aiohttp and curl send a URL's userinfo; percent-escapes
    in it are decoded first."""
    seen: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        seen.append(await read_request(r))
        w.write(OK)

    async with Server(handler) as url:
        client = http1.Http1Client(2.0)
        authority = url.removeprefix("http://")
        resp = await client.send(post(f"http://alice:p%40ss@{authority}"))
        await resp.read()
        await resp.aclose()
        await client.aclose()
    head = seen[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    assert f"host: {authority}".encode() in head
    assert b"authorization: Basic " + base64.b64encode(b"alice:p@ss") in head
    assert b"alice" not in b"".join(line for line in head if not line.startswith(b"authoriz"))

async def test_chunked_body_read_as_it_arrives() -> None:
    go = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await go.wait()
        w.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await w.drain()

    async with Server(handler) as url:
        client = http1.Http1Client(2.0)
        resp = await client.send(post(url))
        assert await resp.read_chunk() == b"first"  # before the rest exists
        go.set()
        assert await resp.read_chunk() == b"second"
        assert await resp.read_chunk() == b""
        await resp.aclose()
        await client.aclose()


@pytest.mark.parametrize("interim", [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"])
async def test_an_interim_answer_is_skipped_and_the_final_status_wins(interim: bytes) -> None:
    """RFC 9110 section 15.2: a 1xx is interim, the final answer follows on the connection
    (a proxy in front of a worker forwards a 100 Continue; 103 Early Hints, RFC 8297). It was
    taken for the answer: status 103 and an empty body, the real one left on the wire."""
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await read_request(r)
            for part in (interim, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n", b"ok"):
                w.write(part)
                await w.drain()
                await asyncio.sleep(0.02)  # each part its own read

    srv = Server(handler)
    async with srv as url:
        client = http1.Http1Client(2.0)
        for _ in range(2):  # and the connection stays in step for the next request
            resp = await client.send(post(url))
            assert (resp.status, await resp.read()) == (200, b"ok")
            await resp.aclose()
        await client.aclose()
    assert srv.connections == 1


async def test_an_answers_retry_after_is_its_own() -> None:
    """The worker's Retry-After (RFC 9110 section 10.2.3) is kept with its answer, for the
    error passed on (gateway.upstream.with_retry_after): the next answer on the same
    connection has none of its own, and an interim answer's fields are dropped with it."""
    answers = [b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\ncontent-length: 2\r\n\r\nno",
               b"HTTP/1.1 103 Early Hints\r\nretry-after: 9\r\n\r\n"
               b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]

    srv = Server(answers_in_turn(answers))
    async with srv as url:
        client = http1.Http1Client(2.0)
        seen = []
        for _ in answers:
            resp = await client.send(post(url))
            seen.append((resp.status, resp.retry_after, await resp.read()))
            await resp.aclose()
        await client.aclose()
    assert seen == [(429, "7", b"no"), (200, None, b"ok")]
    assert srv.connections == 1

async def test_unfinished_body_closed_and_cancelled_request_close_the_connection() -> None:
    srv: Server
    arrived = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        arrived.set()
        if srv.connections == 1:
            w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await srv.until_eof(r)

    srv = Server(handler)
    async with srv as url:
        client = http1.Http1Client(2.0)
        resp = await client.send(post(url))
        assert await resp.read_chunk() == b"abc"
        await resp.aclose()  # the client went away mid-stream
        async with asyncio.timeout(5):
            await srv.closed.wait()
        srv.closed.clear()
        arrived.clear()
        task = asyncio.ensure_future(client.send(post(url)))  # no status line comes
        async with asyncio.timeout(5):
            await arrived.wait()  # the request is at the worker, waiting for its answer
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5):
            await srv.closed.wait()
        assert srv.eofs == 2 and not client.idle.get(("127.0.0.1", int(url.rsplit(":", 1)[1]),
                                                      False))
        await client.aclose()


async def test_idle_connection_closed_by_the_worker_is_replaced() -> None:
    srv = Server(answers_once(OK))  # a worker dropping an idle keep-alive connection
    async with srv as url:
        client = http1.Http1Client(2.0)
        for _ in range(2):
            resp = await client.send(post(url))
            assert await resp.read() == b"ok"
            await resp.aclose()
            await asyncio.sleep(0.05)
        await client.aclose()
    assert srv.connections == 2


async def test_breaks_and_refusals_map_to_gateway_errors() -> None:
    async with Server(answers_once(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
                      ) as url:
        client = http1.Http1Client(2.0)
        resp = await client.send(post(url))
        assert await resp.read_chunk() == b"partial"
        with pytest.raises(errors.UpstreamBroken, match="broke off"):
            await resp.read_chunk()
        await resp.aclose()
        await client.aclose()
    client = http1.Http1Client(2.0)
    with pytest.raises(errors.UpstreamUnavailable, match="could not be reached"):
        await client.send(post(url))  # the server is gone: refused
    assert await upstream.probe(client, url + "/health", 1.0) == 0
    for bad in ("ftp://w:21", "http://:80", "http://w:99999"):  # tried once, never retried
        with pytest.raises(errors.UpstreamError) as err:
            await client.send(post(bad))
        assert type(err.value) is errors.UpstreamError and "not valid" in err.value.message


async def test_connect_timeout_bounds_reaching_a_worker_that_never_accepts() -> None:
    """SPEC.md (Configuration): `timeouts.connect` bounds the connect. A port whose accept
    queue is full takes no connection (the kernel drops further SYNs): the attempt is an
    `UpstreamUnavailable` (retried elsewhere) once the timeout is over, not a hang."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(0)
        filling = [socket.socket() for _ in range(3)]
        try:
            for c in filling:
                c.setblocking(False)
                c.connect_ex(hole.getsockname())
            client = http1.Http1Client(0.5)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(errors.UpstreamUnavailable, match="could not be reached"):
                await asyncio.wait_for(
                    client.send(post(f"http://127.0.0.1:{hole.getsockname()[1]}")), 10)
            assert 0.4 <= loop.time() - started < 5
            await client.aclose()
        finally:
            for c in filling:
                c.close()


async def test_body_without_length_ends_with_the_connection() -> None:
    # the close is the end of the body (RFC 9112 section 6.3)
    async with Server(answers_once(b"HTTP/1.1 500 Internal Server Error\r\nconnection: close"
                                   b"\r\n\r\nout of memory")) as url:
        client = http1.Http1Client(2.0)
        resp = await client.send(post(url))
        assert resp.status == 500 and await resp.read() == b"out of memory"
        await resp.aclose()
        await client.aclose()


async def test_malformed_answer_before_the_status_is_retryable() -> None:
    async with Server(answers_once(b"SMTP ready\r\n\r\n")) as url:
        client = http1.Http1Client(2.0)
        with pytest.raises(errors.UpstreamUnavailable) as exc:
            await client.send(post(url))
        assert "malformed HTTP" in (exc.value.detail or "")  # the log line's, not the client's
        await client.aclose()


async def test_reading_pauses_while_the_reader_lags() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await w.drain()
        await asyncio.sleep(1)

    async with Server(handler) as url:
        client = http1.Http1Client(2.0)
        resp = await client.send(post(url))
        conn = resp._conn
        async with asyncio.timeout(5):  # we read nothing: the client stops reading
            while not conn.paused:
                await asyncio.sleep(0.01)
        assert conn.buffered < 4 * http1.HIGH_WATER
        assert await resp.read() == body
        await resp.aclose()
        await client.aclose()


async def test_a_burst_over_the_high_water_mark_keeps_flowing_through_a_pump() -> None:
    """A worker that writes a whole long answer at once (a fast worker, or a loop that fell
    behind): one read over HIGH_WATER while a pump is attached must not leave reading paused
    (the stream would stall until the idle timeout and end in an error)."""
    line = b"x" * 99 + b"\n"
    body = line * 2000  # 200 KB, written in one go after a first small piece

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                b"%x\r\n%s\r\n" % (len(line), line))
        await w.drain()
        await asyncio.sleep(0.1)  # the pump is attached by now
        w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        await w.drain()
        await asyncio.sleep(2)

    class Lines:
        failed = False

        def __init__(self) -> None:
            self.count = 0

        def feed(self, data: bytes) -> list[object]:
            self.count += data.count(b"\n")
            return [object()]

        def close(self) -> list[object]:
            return []

    async with Server(handler) as url:
        client = http1.Http1Client(2.0)
        resp = await client.send(post(url))
        assert await resp.read_chunk() == line
        lines = Lines()
        p = pump.Pump(resp, lines, lambda batch: True, None, idle=1.0)  # type: ignore[arg-type]
        async with asyncio.timeout(5):
            await p.run(asyncio.sleep)  # type: ignore[arg-type]
        assert lines.count == 2000 and not resp._conn.paused
        await resp.aclose()
        await client.aclose()


async def test_idle_connections_the_worker_closed_leave_the_pool() -> None:
    """A worker that closes idle keep-alive connections (uvicorn after 5 s) or goes away (a pod
    gone from DNS, whose address never comes back): its connections leave the pool as they
    close, and so does its origin once none is left, so that the pool holds only connections
    that are open, however many workers came and went."""
    drop = asyncio.Event()

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(OK)
        await w.drain()
        await drop.wait()  # idle until the worker drops it

    srv = Server(handler)
    async with srv as url:
        client = http1.Http1Client(2.0)
        resps = await asyncio.gather(*(client.send(post(url)) for _ in range(3)))
        for resp in resps:
            assert await resp.read() == b"ok"
            await resp.aclose()
        (origin,) = client.idle
        assert len(client.idle[origin]) == 3
        drop.set()
        async with asyncio.timeout(5):
            while client.idle:
                await asyncio.sleep(0.01)
        resp = await client.send(post(url))  # a new connection, pooled again after
        assert await resp.read() == b"ok"
        await resp.aclose()
        assert len(client.idle[origin]) == 1
        await client.aclose()


class _ClosedAtOnce(asyncio.Transport):
    def close(self) -> None:
        return None


async def test_a_connection_the_worker_closed_as_it_opened_is_unreachable_not_a_bug() -> None:
    """A worker going away (killed, its pod stopping) may close a connection right after
    accepting it, before the request is written: the loop then runs `connection_lost` before
    `send` resumes from the connect. That is a worker that cannot be reached (retried on
    another), not an assertion failure, and the failure that no request awaited is not left
    for asyncio to report as "Future exception was never retrieved" (a churn test saw it)."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        origin = ("127.0.0.1", 9, False)
        conn = http1.Connection(origin)
        conn.connection_made(_ClosedAtOnce())
        conn.connection_lost(None)  # before the request: the head future holds the failure

        class Connected(http1.Http1Client):  # a subclass: compiled (setup.py), its methods
            async def _connection(self, origin: http1.Origin) -> http1.Connection:  # are fixed
                return conn

        client = Connected(2.0)
        with pytest.raises(errors.UpstreamUnavailable, match="could not be reached"):
            await client.send(post("http://127.0.0.1:9"))
        gc.collect()
        await asyncio.sleep(0)
        assert not reported, reported
    finally:
        loop.set_exception_handler(None)


async def test_a_connection_that_dies_unused_leaves_no_unretrieved_failure() -> None:
    """A connect cancelled after `connection_made` (a client gone, or the connect timeout
    firing as the worker accepts) closes a connection no request will ever use. Its failure
    must not be left for asyncio to report as "Future exception was never retrieved": the
    churn test failed on two such reports ("the connection was closed")."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        conn = http1.Connection(("127.0.0.1", 9, False))
        conn.connection_made(_ClosedAtOnce())
        conn.connection_lost(None)
        assert conn.error == "the connection was closed"
        with pytest.raises(ConnectionError, match="the connection was closed"):
            await conn.head  # one that does await the head still gets the failure
        del conn
        unused = http1.Connection(("127.0.0.1", 9, False))
        unused.connection_made(_ClosedAtOnce())
        unused.connection_lost(ConnectionResetError("reset"))
        del unused
        gc.collect()
        await asyncio.sleep(0)
        assert not reported, reported
    finally:
        loop.set_exception_handler(None)
