"""A chunked request body's trailer section (RFC 9112 section 7.1.2) at the gateway's own
server, fed to `http_server.Connection` byte for byte: the request is served, and its trailer
fields stay out of the request's header fields."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway import http_server
from gateway.http_cycle import Cycle

pytestmark = pytest.mark.anyio


class Transport:
    def __init__(self) -> None:
        self.out: list[bytes] = []

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1)

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Host:
    def __init__(self) -> None:
        self.connections: set[http_server.Connection] = set()
        self.head_timeout = self.keep_alive_timeout = 30.0
        self.draining = False
        self.cors = None
        self.seen: list[Cycle] = []
        self.native = {("POST", "/echo"): self.echo}

    async def echo(self, cycle: Cycle) -> None:
        body = (await cycle.receive())["body"]
        self.seen.append(cycle)
        await cycle.send({"type": "http.response.start", "status": 200, "headers": []})
        await cycle.send({"type": "http.response.body", "body": body})

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not routed here")

    def match(self, method: str, path: str) -> None:
        return None


async def test_trailer_fields_are_not_merged_into_the_request_head() -> None:
    """RFC 9110 section 6.5.1: trailer fields are not header fields and are not merged into
    the header section unless the recipient knows the field is safe to merge. They were
    appended to the request's header list (the ASGI scope's `headers`), a `host` among them."""
    host, transport = Host(), Transport()
    conn = http_server.Connection(host)
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(b"POST /echo HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n"
                       b"Trailer: x-checksum\r\n\r\n5\r\nhello\r\n0\r\n"
                       b"x-checksum: abc\r\nHost: elsewhere\r\n\r\n")
    async with asyncio.timeout(5):
        while not host.seen or not transport.out:
            await asyncio.sleep(0.01)
    (cycle,) = host.seen
    assert [k for k, _ in cycle.raw_headers] == [b"host", b"transfer-encoding", b"trailer"]
    assert cycle.headers["host"] == "gw" and "x-checksum" not in cycle.headers
    assert b"".join(transport.out).endswith(b"\r\n\r\nhello")
    conn.connection_lost(None)
