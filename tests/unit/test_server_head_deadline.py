"""The request head's deadline (`timeouts.request_read`, the 408) at the gateway's own server,
fed to `http_server.Connection` read by read: it runs from the head's first read, is not
restarted by the reads after it (a slowloris client cannot stretch it), and a head that comes
whole in one read never arms it. nginx's client_header_timeout likewise bounds the whole head
from its first byte (ngx_http_wait_request_handler arms it once; the later reads of the same
head do not re-add the timer, ngx_http_process_request_headers)."""

from __future__ import annotations

import asyncio

import pytest

from gateway import deadline, http_server
from tests.unit.test_server_trailers import Host, Transport

pytestmark = pytest.mark.anyio

HEAD = b"POST /echo HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\nok"


def _served() -> tuple[Host, Transport, http_server.Connection, deadline.Timeouts,
                       deadline.Timeouts]:
    host, transport = Host(), Transport()
    host.head_timeout, host.keep_alive_timeout = 11.0, 13.0  # one queue each
    conn = http_server.Connection(host)
    conn.connection_made(transport)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    return (host, transport, conn, deadline.timeouts(loop, 11.0),
            deadline.timeouts(loop, 13.0))


async def test_a_head_in_several_reads_has_one_deadline_from_its_first_read() -> None:
    host, transport, conn, head, idle = _served()
    assert conn in idle._due  # a new connection waits `keep_alive` for its first request
    conn.data_received(HEAD[:10])
    armed = head._due[conn]
    assert conn not in idle._due
    conn.data_received(HEAD[10:25])
    assert head._due[conn] is armed  # not armed again: the same entry, the same due time
    conn.data_received(HEAD[25:])
    assert conn not in head._due  # the head is in: no 408 for it
    async with asyncio.timeout(5):
        while not transport.out:
            await asyncio.sleep(0)
    assert conn in idle._due and conn not in head._due  # answered: keep-alive again
    conn.connection_lost(None)


async def test_a_head_in_one_read_arms_no_head_deadline() -> None:
    host, transport, conn, head, idle = _served()
    conn.data_received(HEAD)
    assert conn not in head._due and conn not in idle._due
    async with asyncio.timeout(5):
        while not transport.out:
            await asyncio.sleep(0)
    assert b"".join(transport.out).endswith(b"\r\n\r\nok")
    assert conn in idle._due
    conn.connection_lost(None)


async def test_a_pipelined_head_cut_by_the_read_gets_its_deadline() -> None:
    """One read with a whole request and the start of the next: the second head's deadline
    starts with that read, as when it began a read of its own."""
    host, transport, conn, head, idle = _served()
    conn.data_received(HEAD + HEAD[:20])
    assert conn in head._due
    conn.connection_lost(None)
    assert conn not in head._due and conn not in idle._due
