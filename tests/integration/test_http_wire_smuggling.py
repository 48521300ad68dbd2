"""The listening server against request smuggling's openings (RFC 9112): every ambiguous head
is refused and its connection closed, and every head that is served leaves the connection in
step, so the NEXT request on it is parsed as what it is. Part 1 and 2 (CL+TE, chunk sizes,
limits): test_http_wire_abuse.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.integration import rawhttp
from tests.integration.rawhttp import CHAT, Conn, Gateway, chat, chunked, request

pytestmark = pytest.mark.integration

BODY = chat()
NEXT = request("GET", "/v1/models")  # what follows on the same connection
HEAD = f"POST {CHAT} HTTP/1.1\r\nHost: gw\r\n".encode()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = rawhttp.start(tmp_path_factory.mktemp("http-wire-smuggling"))
    try:
        yield g
    finally:
        g.proc.stop()


# (raw request, the status it is refused with); each followed by NEXT on the connection
REFUSED = {
    # RFC 9112 section 6.3: Content-Length values that differ MUST be treated as
    # unrecoverable; equal ones MAY be, and a list of them is not a valid value (6.2)
    "two-lengths-equal": (HEAD + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(BODY), len(BODY), BODY), 400),
    "two-lengths-different": (HEAD + b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n%s"
                              % (len(BODY), BODY), 400),
    "length-list": (HEAD + b"Content-Length: %d, %d\r\n\r\n%s" % (len(BODY), len(BODY), BODY),
                    400),
    # 7.1: chunked MUST NOT be applied twice; two field lines are the same list (RFC 9110 5.3)
    "chunked-chunked": (HEAD + b"Transfer-Encoding: chunked, chunked\r\n\r\n" + chunked(BODY),
                        400),
    "two-te-lines": (HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunked(BODY), 400),
    # 5.2: obs-fold outside message/http MUST be refused with 400 (or replaced by SP)
    "obs-fold-te": (HEAD + b"Transfer-Encoding: gzip\r\n , chunked\r\n\r\n" + chunked(BODY),
                    400),
    # 5.1: whitespace between a field name and its colon MUST be refused with 400
    "space-before-colon": (HEAD + b"Transfer-Encoding : chunked\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(BODY), BODY), 400),
    # RFC 9110 section 5.5: CR, LF and NUL in a field value are invalid; a recipient MUST
    # refuse them or replace them with SP: refused, so that no echo can split a header
    "nul-in-value": (b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Request-Id: a\x00b\r\n\r\n", 400),
    "bare-cr-in-value": (b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Request-Id: a\rb\r\n\r\n", 400),
    "control-in-value": (b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Request-Id: a\x1b[2J\r\n\r\n",
                         400),
    # RFC 9110 section 15.6.6: a major version the server does not support
    "http-2.0-line": (b"GET /health HTTP/2.0\r\nHost: gw\r\n\r\n", 505),
    "http-0.9-line": (b"GET /health HTTP/0.9\r\nHost: gw\r\n\r\n", 505),
}


@pytest.mark.parametrize("raw", REFUSED, ids=list(REFUSED))
def test_an_ambiguous_head_is_refused_and_nothing_after_it_is_read(gw: Gateway, raw: str) -> None:
    """Each is refused before reaching a route, then the connection is closed: what follows is
    never taken as a request (a desync would answer it)."""
    data, status = REFUSED[raw]
    before = gw.requests_logged()
    with Conn(gw.addr) as c:
        c.send(data + NEXT)
        r = c.response()
        assert r.status == status, (r.status, r.body[:200])
        assert r.header("connection") == "close"
        assert c.buf == b"" and c.closed_by_peer(2.0)
    time.sleep(0.3)  # a request that did reach the app would be logged by now
    assert gw.requests_logged() == before


SERVED = {
    # RFC 9112 section 3.2.2: a server MUST accept the absolute form, and then ignores Host
    "absolute-form-other-host": b"GET http://elsewhere.example/health HTTP/1.1\r\n"
                                b"Host: gw\r\n\r\n",
    # 7.1.1: a recipient MUST ignore chunk extensions it does not understand; 64 KiB of them
    "large-chunk-extension": HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
                             + b"%x;x=" % len(BODY) + b"a" * 65536 + b"\r\n" + BODY
                             + b"\r\n0\r\n\r\n",
    # a body on a GET is framed (and skipped) by its Content-Length like any other
    "get-with-body": b"GET /health HTTP/1.1\r\nHost: gw\r\nContent-Length: 21\r\n\r\n"
                     b"GET /v1/models HTTP/1",
    "trailer-fields": HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(BODY)[:-2]
                      + b"X-Checksum: 1\r\n\r\n",
    "obs-text-request-id": b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Request-Id: caf\xe9\r\n\r\n",
}


@pytest.mark.parametrize("raw", SERVED, ids=list(SERVED))
def test_a_served_head_leaves_the_connection_in_step(gw: Gateway, raw: str) -> None:
    """Served, then the next request on the same keep-alive connection is answered as itself
    (a model list), not as bytes left over from the first."""
    with Conn(gw.addr) as c:
        c.send(SERVED[raw] + NEXT)
        first = c.response("GET" if SERVED[raw].startswith(b"GET") else "POST")
        assert first.status == 200, (first.status, first.body[:200])
        second = c.response("GET")
        assert second.status == 200 and json.loads(second.body)["object"] == "list"
        assert c.buf == b""


def test_an_echoed_request_id_is_the_clients_bytes_on_one_line(gw: Gateway) -> None:
    """obs-text (RFC 9110 section 5.5) passes, echoed byte for byte: it cannot end the line,
    since CR, LF and NUL never get in (above)."""
    with Conn(gw.addr) as c:
        c.send(b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Request-Id: caf\xe9\t1\r\n\r\n")
        r = c.response("GET")
    assert r.header("x-request-id") == b"caf\xe9\t1".decode("latin-1")


def test_an_http10_request_with_transfer_encoding_is_answered_then_closed(gw: Gateway) -> None:
    """RFC 9112 section 6.1: a server that receives an HTTP/1.0 message with Transfer-Encoding
    MUST treat its framing as faulty and close the connection after processing it, even when
    the client asks to keep it alive (an HTTP/1.0 hop in front may have framed it otherwise)."""
    raw = (f"POST {CHAT} HTTP/1.0\r\nConnection: keep-alive\r\n"
           "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked(BODY)
    with Conn(gw.addr) as c:
        c.send(raw + NEXT)
        r = c.response()
        assert r.status == 200 and json.loads(r.body)["choices"]
        assert r.header("connection") == "close"
        assert c.buf == b"" and c.closed_by_peer(2.0)
    with Conn(gw.addr) as c:  # with Content-Length, HTTP/1.0 keep-alive still holds
        c.send(request("POST", CHAT, BODY, {"Connection": "keep-alive"}, "HTTP/1.0") + NEXT)
        assert c.response().header("connection") == "keep-alive"
        assert c.response("GET").status == 200


@pytest.mark.parametrize("target", [CHAT + "/", "/predictions/demo/?x=1"])
def test_a_slash_redirect_never_names_the_clients_host(gw: Gateway, target: str) -> None:
    """Starlette's redirect_slashes built the 307's Location from the Host header, so a
    client (or a poisoned cache in front) got `Location: http://evil.example/...`; a relative
    reference (RFC 9110 section 10.2.2) sends it to the same origin whatever Host said."""
    with Conn(gw.addr) as c:
        c.send(request("POST", target, BODY).replace(b"Host: gateway.test",
                                                      b"Host: evil.example"))
        r = c.response()
    assert r.status == 307
    assert r.header("location") == target.replace("/?", "?").rstrip("/")
    assert "evil" not in (r.header("location") or "") and r.header("x-request-id")
