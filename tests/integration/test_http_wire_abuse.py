"""The listening server at the byte level, part 2: malformed requests, limits and slow or
vanishing clients (RFC 9112, RFC 9110, SPEC.md server.max_request_bytes and timeouts). Each
wait is bounded. uvicorn, which gateway.http_server replaced, had no limit on the request
head, no timeout before a head completes, and kept the connection after a 413. Well-formed framing and reuse: test_http_wire.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.integration import rawhttp
from tests.integration.rawhttp import CHAT, Conn, Gateway, chat, chunked, request

pytestmark = pytest.mark.integration

# A connection that never completes a request head is dropped within this many seconds
# (timeouts.request_read, 1 s here, plus slack for a server that keeps a separate head timeout).
HEAD_BOUND = 10.0
KEEP_ALIVE = 2.0  # timeouts.keep_alive here (the default, 75 s, is tested in test_http_wire.py)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = rawhttp.start(tmp_path_factory.mktemp("http-wire-abuse"), keep_alive=KEEP_ALIVE)
    try:
        yield g
    finally:
        g.proc.stop()


def served(gw: Gateway) -> None:
    """A fresh connection still gets a whole answer, promptly."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat()))
        r = c.response()
    assert r.status == 200 and json.loads(r.body)["choices"]


def refused(c: Conn) -> rawhttp.Response | None:
    """The answer to a request the server must refuse: a 400 (None when it closes without
    one), then the close; never a 5xx, never a hang."""
    try:
        r: rawhttp.Response | None = c.response()
    except EOFError:
        assert c.buf == b"", c.buf[:200]
        r = None
    if r is not None:
        assert r.status == 400, (r.status, r.body[:300])
        assert len(r.header("x-request-id") or "") >= 16  # every answer has one (SPEC.md)
        assert c.buf == b"" and c.closed_by_peer(2.0)
    return r


@pytest.mark.parametrize("head", [
    b"GARBAGE\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad-Name : v\r\n\r\n",  # RFC 9112 section 5.1: 400
    b"GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n",  # a target no URL parser takes
    b"GET http://a:99999/ HTTP/1.1\r\nHost: x\r\n\r\n",
], ids=["request-line", "no-colon", "space-in-name", "space-before-colon", "bad-authority",
        "bad-port"])
def test_malformed_head_is_400_and_the_server_goes_on(gw: Gateway, head: bytes) -> None:
    """RFC 9112 sections 3 and 5: a request line or field line that does not parse is a 400
    and the connection is closed (its framing is unknown); other clients are unaffected."""
    with Conn(gw.addr) as c:
        c.send(head)
        refused(c)
    served(gw)


def test_content_length_with_transfer_encoding_is_400_never_served(gw: Gateway) -> None:
    """RFC 9112 section 6.1: both framings at once is request smuggling's opening; refused
    with a 400 and the connection closed, the request never reaching the gateway's routes."""
    body = chat()
    before = gw.requests_logged()
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chunked(body), {"Content-Length": str(len(body)),
                                                     "Transfer-Encoding": "chunked"}))
        r = refused(c)
    assert r is not None
    time.sleep(0.3)  # a request that did reach the app would be logged by now
    assert gw.requests_logged() == before
    served(gw)


def test_huge_request_head_is_431(gw: Gateway) -> None:
    """RFC 6585 section 5: a head of 100 KiB (one field) is refused with 431 (or 400) and the
    connection closed; nginx's and h11's limits are far below that."""
    with Conn(gw.addr) as c:
        c.send(request("GET", "/health", headers={"X-Big": "a" * 100 * 1024}))
        r = c.response("GET")
        assert r.status in (431, 400), r.status
        assert c.closed_by_peer(2.0)
    served(gw)


@pytest.mark.parametrize("target", ["/health", CHAT, "/invocations", "/generate"])
def test_a_request_target_over_8_kib_is_414(gw: Gateway, target: str) -> None:
    """RFC 9110 section 15.5.15: a target longer than the server will interpret is a 414, and
    the connection closed; 8 KiB as nginx's large_client_header_buffers and Apache's
    LimitRequestLine (8190) default to. One of 4 KiB is still served."""
    with Conn(gw.addr) as c:
        c.send(request("GET", "/health?pad=" + "a" * 4096))
        assert c.response("GET").status == 200
    with Conn(gw.addr) as c:
        c.send(request("POST", target + "?pad=" + "a" * 9000, chat()))
        r = c.response()
        assert r.status == 414, (r.status, r.body[:200])
        assert len(r.header("x-request-id") or "") >= 16  # refused before any field: a new id
        assert c.closed_by_peer(2.0)
    served(gw)


def test_one_header_field_over_16_kib_is_431(gw: Gateway) -> None:
    """RFC 6585 section 5 allows a 431 for a single field too large; at 16 KiB, where Node's
    http server (--max-http-header-size) and h11 (max_incomplete_event_size) stop. A 12 KiB
    field (a large token) is still served."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat(), headers={"Authorization": "Bearer " + "t" * 12288}))
        assert c.response().status == 200
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat(), headers={"X-Long": "a" * 20000}))
        r = c.response()
        assert r.status == 431, (r.status, r.body[:200])
        assert c.closed_by_peer(2.0)
    served(gw)


def test_more_than_100_header_fields_are_431(gw: Gateway) -> None:
    """RFC 6585 section 5: too many header fields is a 431 and the connection closed, at
    hyper's limit (src/proto/h1/role.rs DEFAULT_MAX_HEADERS = 100, the server TGI runs on);
    a head of exactly 100 (Host, Content-Length and 98 more) is still served."""
    many = {f"X-Field-{i}": "v" for i in range(98)}
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat(), headers=many))
        assert c.response().status == 200
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat(), headers={
            "X-Request-Id": "too-many-fields", **{f"X-Field-{i}": "v" for i in range(300)}}))
        r = c.response()
        assert r.status == 431, (r.status, r.body[:200])
        assert r.all("x-request-id") == ["too-many-fields"]  # read before the refusal
        assert c.closed_by_peer(2.0)
    served(gw)


def too_big(c: Conn, how: str) -> None:
    """A request whose body passes max_request_bytes: declared so, or chunks that grow past it
    (the last chunk never sent: the server must not wait for it)."""
    if how == "declared":
        c.send(request("POST", CHAT, headers={"Content-Length": str(rawhttp.MAX_BODY + 1)}))
        c.send(b"{" * 1000)
    else:
        c.send(request("POST", CHAT, headers={"Transfer-Encoding": "chunked"}))
        part = b"a" * 8192
        for _ in range(rawhttp.MAX_BODY // len(part) + 2):
            c.send(b"%x\r\n%s\r\n" % (len(part), part))


@pytest.mark.parametrize("how", ["declared", "chunked"])
def test_body_over_max_request_bytes_is_413_in_openai_error_body(gw: Gateway, how: str) -> None:
    """SPEC.md: a body over `server.max_request_bytes` is a 413 in the client's error body."""
    with Conn(gw.addr) as c:
        too_big(c, how)
        r = c.response()
    assert r.status == 413
    err = json.loads(r.body)["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    served(gw)


@pytest.mark.parametrize("how", ["declared", "chunked"])
def test_413_closes_the_connection(gw: Gateway, how: str) -> None:
    """RFC 9110 section 15.5.14: a server refusing a body it will not read closes the
    connection (with `connection: close`), as nginx does, rather than wait for the rest."""
    with Conn(gw.addr) as c:
        too_big(c, how)
        r = c.response()
        assert r.status == 413
        assert (r.header("connection") or "").lower() == "close"
        assert c.closed_by_peer(2.0)


def test_body_that_stalls_is_408(gw: Gateway) -> None:
    """SPEC.md server.timeouts.request_read: a client that sends its head and part of the
    declared body, then nothing, is answered 408 once the timeout passes."""
    body = chat()
    with Conn(gw.addr, timeout=rawhttp.REQUEST_READ + 5) as c:
        c.send(request("POST", CHAT, headers={"Content-Length": str(len(body))}) + body[:10])
        started = time.monotonic()
        r = c.response()
        waited = time.monotonic() - started
    assert r.status == 408, r.body[:300]
    assert json.loads(r.body)["error"]["message"]
    assert rawhttp.REQUEST_READ - 0.2 < waited < rawhttp.REQUEST_READ + 3


def test_stalled_head_never_blocks_other_clients(gw: Gateway) -> None:
    """Half a request head (and a connection that sends nothing) must not hold up anyone."""
    with Conn(gw.addr) as half, Conn(gw.addr):
        half.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        for _ in range(3):
            started = time.monotonic()
            served(gw)
            assert time.monotonic() - started < 2


def test_stalled_head_and_silent_connection_are_dropped(gw: Gateway) -> None:
    """Slowloris: a connection that stops mid-head, or never sends a byte, is closed within
    HEAD_BOUND (nginx: client_header_timeout; the 408 may be sent first or not)."""
    with Conn(gw.addr) as half, Conn(gw.addr) as silent:
        half.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        deadline = time.monotonic() + HEAD_BOUND
        for c in (half, silent):
            assert c.closes_within(max(0.0, deadline - time.monotonic()))
            assert c.buf == b"" or c.buf.startswith((b"HTTP/1.1 408 ", b"HTTP/1.1 400 ")), c.buf


def test_idle_keep_alive_connection_is_closed(gw: Gateway) -> None:
    """An idle kept-alive connection is closed by the server after `timeouts.keep_alive`."""
    with Conn(gw.addr) as c:
        c.send(request("GET", "/health"))
        assert c.response("GET").status == 200
        started = time.monotonic()
        assert c.closed_by_peer(KEEP_ALIVE + 5.0), f"kept open for {KEEP_ALIVE + 5:g} s"
    assert time.monotonic() - started > KEEP_ALIVE - 0.5  # not before it either


def test_client_closing_mid_stream_is_logged_and_others_are_served(gw: Gateway) -> None:
    """SPEC.md: a client that disconnects ends its request (the log's outcome `client_closed`)
    and nothing else."""
    rid = "wire-closed-mid-stream"
    body = chat(stream=True, content="slow [[sim itl_ms=200]]", max_tokens=50)
    c = Conn(gw.addr)
    c.send(request("POST", CHAT, body, {"X-Request-Id": rid}))
    assert c.head().status == 200
    assert c.first_chunk().startswith(b"data: {")
    c.close()
    mine = logged(gw, rid)
    assert [r["outcome"] for r in mine] == ["client_closed"], mine


def logged(gw: Gateway, rid: str) -> list[dict[str, object]]:
    """The log lines of request `rid`, waited for (up to 5 s) once the server is idle."""
    served(gw)
    deadline = time.monotonic() + 5
    mine: list[dict[str, object]] = []
    while not mine and time.monotonic() < deadline:
        mine = [r for r in gw.log_records() if r.get("request_id") == rid]
        time.sleep(0.05)
    return mine


@pytest.mark.parametrize("path", [CHAT, "/invocations", "/generate", "/_inference/completion/demo"])
def test_client_closing_inside_its_body_is_logged_as_client_closed(gw: Gateway,
                                                                    path: str) -> None:
    """A client that leaves before its body ended is a disconnect (outcome `client_closed`,
    no status: nothing was answered), not a 400 the client made and never read."""
    rid = "wire-closed-in-body-" + path.strip("/").replace("/", "-")
    c = Conn(gw.addr)
    c.send(request("POST", path, headers={"X-Request-Id": rid, "Content-Length": "100"})
           + b'{"inputs": "hi"')
    time.sleep(0.2)  # the request is under way, waiting for the rest of its body
    c.close()
    mine = logged(gw, rid)
    assert [(r["outcome"], r["status"]) for r in mine] == [("client_closed", 0)], mine


BAD_LINE = b"NOT A REQUEST LINE\r\n\r\n"


@pytest.mark.parametrize("after", [
    BAD_LINE,
    request("POST", CHAT, headers={"Transfer-Encoding": "chunked"}) + b"zz\r\n",
], ids=["bad-request-line", "bad-chunk-size"])
def test_bytes_that_do_not_parse_wait_for_the_answer_before_them(gw: Gateway,
                                                                  after: bytes) -> None:
    """RFC 9112 section 9.3.2: pipelined requests are answered in order. A request that does
    not parse, in the same packet as a good one, gets its 400 only after the good one's whole
    answer; then the connection closes."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat()) + after)
        r = c.response()
        assert r.status == 200 and json.loads(r.body)["choices"], r.body[:300]
        assert refused(c) is not None


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
def test_bytes_that_do_not_parse_never_cut_a_stream(gw: Gateway, close: bool) -> None:
    """SPEC.md: a stream is never cut silently. Bad bytes sent while a stream is under way
    wait for its end (`[DONE]`, the last chunk), then get their 400 (RFC 9112 section 9.3.2);
    after a request with `Connection: close` nothing more is read (section 9.6): no 400."""
    body = chat(stream=True, content="slow [[sim itl_ms=100]]", max_tokens=8)
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, body, {"Connection": "close"} if close else None))
        assert c.head().status == 200
        first = c.first_chunk()
        c.send(BAD_LINE)
        rest = c.chunks_to_end()
        assert b"".join([first, *rest]).endswith(b"data: [DONE]\n\n"), rest[-2:]
        if close:
            assert c.buf == b"" and c.closed_by_peer(2.0)
        else:
            assert refused(c) is not None


@pytest.mark.parametrize("after", [request("GET", "/health"), BAD_LINE],
                         ids=["request", "bad-bytes"])
def test_nothing_after_a_request_with_connection_close_is_read(gw: Gateway,
                                                                after: bytes) -> None:
    """RFC 9112 section 9.6: after a request with `Connection: close` the server sends its
    answer and processes no further request: the answer comes whole, then the close; what
    followed in the same packet is not answered."""
    with Conn(gw.addr) as c:
        c.send(request("GET", "/v1/models", headers={"Connection": "close"}) + after)
        r = c.response("GET")
        assert r.status == 200 and json.loads(r.body)["data"], r.body[:300]
        assert c.buf == b"" and c.closed_by_peer(2.0)


@pytest.mark.parametrize("chunks", [
    b"zz\r\n", b"-5\r\n", b"f" * 18 + b"\r\n", b"5\r\n0123456789\r\n",
], ids=["not-hex", "negative", "overflow", "longer-than-its-size"])
def test_malformed_chunked_body_is_400(gw: Gateway, chunks: bytes) -> None:
    """RFC 9112 section 7.1: a chunked body that does not parse, before any answer began, is
    a 400 and the connection closed; never a bare close (a proxy in front reports that as a
    502 of ours)."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, headers={"Transfer-Encoding": "chunked"}) + chunks)
        assert refused(c) is not None
    served(gw)


@pytest.mark.parametrize("coding", ["identity", "gzip, chunked"])
def test_a_transfer_coding_other_than_chunked_is_501(gw: Gateway, coding: str) -> None:
    """RFC 9112 section 6.1: a server that receives a transfer coding it does not understand
    SHOULD answer 501; a gzip-coded body is never read as if it were plain JSON."""
    body = chat()
    before = gw.requests_logged()
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chunked(body) if "chunked" in coding else body,
                       {"Transfer-Encoding": coding}))
        r = c.response()
        assert r.status == 501, (r.status, r.body[:300])
        assert c.buf == b"" and c.closed_by_peer(2.0)
    time.sleep(0.3)  # a request that did reach the app would be logged by now
    assert gw.requests_logged() == before


@pytest.mark.parametrize("head", [
    b"GET /health HTTP/1.1\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
], ids=["no-host", "two-hosts"])
def test_http11_request_without_exactly_one_host_is_400(gw: Gateway, head: bytes) -> None:
    """RFC 9112 section 3.2: a server MUST answer 400 to an HTTP/1.1 request without a Host
    field line or with more than one; HTTP/1.0 may leave Host out."""
    with Conn(gw.addr) as c:
        c.send(head)
        assert refused(c) is not None
    with Conn(gw.addr) as c:
        c.send(b"GET /health HTTP/1.0\r\n\r\n")
        assert c.response("GET").status == 200
