"""The Python floor for bench/bench.py: what any proxy written on asyncio + uvloop + httptools
pays before it does anything with what it relays. Not a product feature and not a test.

    python bench/python_floor.py --port P --upstream-port U [--mode bytes|json]

A client's request is parsed with httptools and sent to the worker (one keep-alive connection
per client connection, as the gateway's pool ends up under a steady load); the worker's
answer is parsed with httptools and written back: a whole answer with its Content-Length in
one write, a stream's body chunk by chunk as it arrives (HTTP/1.1 chunked). `--mode json`
also does the least a re-encoding proxy does to each SSE event and each whole answer:
`orjson.loads` it and `orjson.dumps` it again. Nothing else: no validation, routing, log line, metrics, timers or
failover. It answers `GET /health` itself. Its CPU per chunk and per request, beside nginx's
and the gateway's in the same run, shows how much of the gateway's cost any pure-Python
relay would pay anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import httptools
import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fast_upstream import serve_until_stopped  # noqa: E402

HEALTH = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"


class Upstream(asyncio.Protocol):
    """The worker's side of one client connection."""

    def __init__(self, client: Client):
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.chunked = False
        self.parts: list[bytes] = []
        self.ctype = b"application/json"
        self.tail = b""  # an SSE event split across reads (json mode)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.upstream_lost()

    def on_message_begin(self) -> None:
        self.chunked = False
        self.parts = []
        self.tail = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"transfer-encoding":
            self.chunked = True
        elif name == b"content-type":
            self.ctype = value

    def on_headers_complete(self) -> None:
        if self.chunked:
            self.client.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + self.ctype
                              + b"\r\ntransfer-encoding: chunked\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if not self.chunked:
            self.parts.append(body)
            return
        if self.client.json:
            body = self.reencode(body)
            if not body:
                return
        self.client.write(b"%x\r\n%b\r\n" % (len(body), body))

    def reencode(self, body: bytes) -> bytes:
        events = (self.tail + body).split(b"\n\n")
        self.tail = events.pop()
        out = []
        for e in events:
            if e.startswith(b"data: {"):
                out.append(b"data: " + orjson.dumps(orjson.loads(e[6:])) + b"\n\n")
            elif e:
                out.append(e + b"\n\n")
        return b"".join(out)

    def on_message_complete(self) -> None:
        if self.chunked:
            self.client.write(b"0\r\n\r\n")
        else:
            body = b"".join(self.parts)
            if self.client.json:
                body = orjson.dumps(orjson.loads(body))
            self.client.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + self.ctype
                              + b"\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))


class Client(asyncio.Protocol):
    def __init__(self, upstream_port: int, json: bool):
        self.upstream_port = upstream_port
        self.json = json
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.upstream: Upstream | None = None
        self.connecting: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def upstream_lost(self) -> None:
        self.upstream = None

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.url == b"/health":
            self.write(HEALTH)
            return
        body = b"".join(self.body)
        request = (b"POST " + self.url + b" HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                   b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                   % (len(body), body))
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.write(request)
        else:
            asyncio.get_running_loop().create_task(self.connect(request))

    async def connect(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(lambda: Upstream(self), "127.0.0.1",
                                                self.upstream_port)
        self.upstream = proto
        assert proto.transport is not None
        proto.transport.write(request)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--mode", choices=["bytes", "json"], default="bytes")
    args = p.parse_args()
    json = args.mode == "json"
    uvloop.run(serve_until_stopped(lambda: Client(args.upstream_port, json), "127.0.0.1",
                                   args.port))


if __name__ == "__main__":
    main()
