"""The listening server at the byte level, part 1: framing and connection reuse of well-formed
requests (RFC 9112, RFC 9110), written against the contract rather than any one server: the
gateway's own server (gateway.http_server) passes all of it; uvicorn, which it replaced, failed
the Content-Length, HTTP/1.0 framing and limit cases. Abuse and limits: test_http_wire_abuse.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from tests.integration import rawhttp
from tests.integration.rawhttp import CHAT, Conn, Gateway, Response, chat, chunked, request

pytestmark = pytest.mark.integration

# Response header names that may legitimately appear more than once (RFC 9110 section 5.3;
# set-cookie is the one field that cannot be folded, RFC 6265 section 3).
REPEATABLE = {"set-cookie", "vary", "cache-control", "link"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = rawhttp.start(tmp_path_factory.mktemp("http-wire"))
    try:
        yield g
    finally:
        g.proc.stop()


def assert_whole(r: Response) -> None:
    assert r.status == 200, (r.status, r.body[:300])
    assert json.loads(r.body)["choices"][0]["message"]["role"] == "assistant"


def assert_stream(r: Response) -> None:
    """A chunk-framed SSE answer: `Conn.response` has read it up to its 0-length last chunk."""
    assert r.status == 200, (r.status, r.body[:300])
    assert (r.header("content-type") or "").startswith("text/event-stream")
    assert r.framing == "chunked" and r.header("content-length") is None
    assert r.chunks and all(r.chunks)  # a 0-length chunk would have ended the body early
    assert r.body.startswith(b"data: {") and r.body.endswith(b"data: [DONE]\n\n"), r.body[-200:]


def test_keep_alive_whole_then_stream_then_a_third(gw: Gateway) -> None:
    """RFC 9112 section 9.3: HTTP/1.1 connections persist; section 7.1: a stream of unknown
    length is chunk-framed and ends with the last (0-length) chunk, after which the connection
    serves the next request."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat()))
        assert_whole(c.response())
        c.send(request("POST", CHAT, chat(stream=True)))
        assert_stream(c.response())
        c.send(request("GET", "/v1/models"))
        third = c.response("GET")
        assert third.status == 200 and json.loads(third.body)["data"][0]["id"] == rawhttp.MODEL
        assert c.buf == b""


def test_idle_connection_outlives_a_load_balancers_idle_timeout_window(gw: Gateway) -> None:
    """An AWS ALB keeps idle connections to its targets for 60 s and asks targets to keep
    theirs longer ("configure the idle timeout of your application to be larger than the idle
    timeout configured for the load balancer", ALB docs, Connection idle timeout);
    ingress-nginx's upstream-keepalive-timeout is 60 s too. A server that closes first (uvicorn
    and Node: 5 s) races the proxy's next request on that connection into a 502. The default
    `timeouts.keep_alive` is 75 s (nginx's own keepalive_timeout): a connection idle past
    uvicorn's 5 s still serves, and `Connection: close` is not sent on a kept answer."""
    with Conn(gw.addr) as c:
        c.send(request("GET", "/health"))
        first = c.response("GET")
        assert first.status == 200 and first.header("connection") != "close"
        assert not c.closed_by_peer(6.0), "closed an idle connection within 6 s"
        c.send(request("POST", CHAT, chat()))
        assert_whole(c.response())


def test_whole_answer_has_content_length(gw: Gateway) -> None:
    """A whole (non-streamed) answer is one body known up front: Content-Length, no chunking
    (RFC 9112 section 6.3), as vLLM's and OpenAI's servers send it."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat()))
        r = c.response()
    assert_whole(r)
    assert r.framing == "length" and r.header("transfer-encoding") is None
    assert int(r.header("content-length") or -1) == len(r.body)


def test_pipelined_requests_are_answered_in_order(gw: Gateway) -> None:
    """RFC 9112 section 9.3.2: a server MUST answer pipelined requests in the order received."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat(), {"x-request-id": "pipe-1"})
               + request("POST", CHAT, chat(stream=True), {"x-request-id": "pipe-2"})
               + request("GET", "/v1/models"))
        first, second, third = c.response(), c.response(), c.response("GET")
    assert_whole(first)
    assert first.header("x-request-id") == "pipe-1"
    assert_stream(second)
    assert second.header("x-request-id") == "pipe-2"
    assert third.status == 200 and b'"object":"list"' in third.body


def test_a_pipelined_body_that_arrives_late_is_still_read(gw: Gateway) -> None:
    """The second of two pipelined requests sends its head while the first is still being
    answered (a slow stream) and its body only afterwards: it is read and answered too."""
    slow = chat(stream=True, content="slow [[sim itl_ms=40]]", max_tokens=8)
    body = chat(content="x" * 30_000)
    second_head = request("POST", CHAT, body)[:-len(body)]
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, slow) + second_head)
        first = c.response()
        c.send(body)
        second = c.response()
    assert_stream(first)
    assert_whole(second)


def test_expect_100_continue_then_body(gw: Gateway) -> None:
    """RFC 9110 section 10.1.1: the client waits for `100 Continue` before sending its body."""
    body = chat()
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, headers={"Content-Length": str(len(body)),
                                              "Expect": "100-continue"}))
        interim = c.head()  # bounded by the socket timeout: a server that never says 100 fails
        assert (interim.version, interim.status) == ("HTTP/1.1", 100)
        c.send(body)
        assert_whole(c.response())


def test_chunked_request_body(gw: Gateway) -> None:
    """RFC 9112 section 7.1: a request body in three chunks is one body."""
    body = chat()
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chunked(body[:7], body[7:30], body[30:]),
                       {"Transfer-Encoding": "chunked"}))
        assert_whole(c.response())
        c.send(request("GET", "/health"))  # the body's end was found: the connection goes on
        assert c.response("GET").status == 200


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_http10_is_answered_and_closed(gw: Gateway, stream: bool) -> None:
    """RFC 9112 section 9.3: an HTTP/1.0 request without keep-alive gets its answer and then
    the server closes the connection."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat(stream=stream), version="HTTP/1.0"))
        r = c.response()
        assert r.framing == "close" or c.closed_by_peer(2.0)  # "close": read up to the close
    assert r.status == 200
    if stream:
        assert r.body.startswith(b"data: {") and r.body.endswith(b"data: [DONE]\n\n")
    else:
        assert_whole(r)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_http10_answer_is_not_chunk_framed(gw: Gateway, stream: bool) -> None:
    """RFC 9112 section 6.1: a server MUST NOT send Transfer-Encoding to an HTTP/1.0 request;
    a whole answer has Content-Length (or ends at close), a stream's SSE bytes are sent as they
    are and the close ends them (section 6.3, rule 8)."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat(stream=stream), version="HTTP/1.0"))
        r = c.response()
        assert r.framing == "close" or c.closed_by_peer(2.0)
    assert r.status == 200 and r.header("transfer-encoding") is None
    if stream:
        assert r.framing == "close"
        assert r.body.startswith(b"data: {") and r.body.endswith(b"data: [DONE]\n\n")
        assert b"\r\n" not in r.body  # no chunk-size lines inside the SSE bytes
    else:
        assert_whole(r)


def test_connection_close_is_honoured(gw: Gateway) -> None:
    """RFC 9112 section 9.6: after a request with `Connection: close` the server answers with
    `connection: close` and closes."""
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, chat(), {"Connection": "close"}))
        r = c.response()
        assert_whole(r)
        assert (r.header("connection") or "").lower() == "close"
        assert c.closed_by_peer(2.0)


def test_head_health_has_no_body(gw: Gateway) -> None:
    """RFC 9110 section 9.3.2: a HEAD response has no content; the next response on the
    connection starts right after its head."""
    with Conn(gw.addr) as c:
        c.send(request("HEAD", "/health"))
        r = c.response("HEAD")
        assert r.status == 200
        assert not c.closed_by_peer(0.5) and c.buf == b""  # raises if any body bytes came
        c.send(request("GET", "/health"))
        assert c.response("GET").status == 200


@pytest.mark.parametrize(("method", "target", "status"), [
    ("GET", "/no/such/route", 404),
    ("GET", CHAT, 405),  # RFC 9110 section 15.5.6; Starlette adds `allow: POST`
    ("POST", CHAT + "?foo=1", 200),  # the query is not part of the route
])
def test_route_statuses(gw: Gateway, method: str, target: str, status: int) -> None:
    with Conn(gw.addr) as c:
        c.send(request(method, target, chat() if method == "POST" else b""))
        r = c.response(method)
        assert r.status == status, r.body[:300]
        c.send(request("GET", "/health"))  # an error status does not cost the connection
        assert c.response("GET").status == 200
    if status == 405:
        assert r.header("allow") == "POST"


@pytest.mark.parametrize(("method", "target", "status", "shape"), [
    # OpenAI's API answers a path it has no route for with 404 and code "unknown_url"
    ("POST", "/v1/chat/completion", 404, "openai"),
    ("GET", CHAT, 405, "openai"),
    # Elasticsearch's RestController: 405 in its simple form, 400 "no handler found"
    ("GET", "/_inference/chat_completion/demo/_stream", 405, "elastic"),
    ("POST", "/_inference/demo/x/_nothing?pretty", 400, "elastic"),
    ("POST", "/generate/more", 404, "tgi"),
    ("POST", "/generate_stream/more", 404, "tgi"),  # not a 200 and an error event
    ("PUT", "/", 405, "tgi"),
    ("GET", "/invocations", 405, "lmi"),
    ("GET", "/no/such/route", 404, "text"),
])
def test_a_path_no_route_takes_is_refused_in_its_protocols_error_body(
        gw: Gateway, method: str, target: str, status: int, shape: str) -> None:
    """SPEC.md: bad input gets a 4xx in the calling protocol's error body; which protocol is
    calling, for a path no route takes, is told by the path's first segment (/v1: OpenAI,
    /_inference: Elasticsearch, /generate: TGI, /invocations: SageMaker). The status stays
    404 or 405 (with Allow); a path under no protocol's prefix keeps a plain-text answer."""
    with Conn(gw.addr) as c:
        c.send(request(method, target, chat() if method == "POST" else b"",
                       {"X-Request-Id": "no-route-1"}))
        r = c.response(method)
    assert r.status == status, r.body[:300]
    assert r.all("x-request-id") == ["no-route-1"]  # echoed, as by every route (SPEC.md)
    if status == 405:
        assert r.header("allow")
    if shape == "text":
        assert (r.header("content-type") or "").startswith("text/plain")
        return
    assert (r.header("content-type") or "").startswith("application/")
    body = json.loads(r.body)
    path = target.partition("?")[0]
    if shape == "openai":
        err = body["error"]
        assert err["type"] == "invalid_request_error" and path in err["message"]
        assert err["code"] == ("unknown_url" if status == 404 else "method_not_allowed")
    elif shape == "elastic":  # RestController handleUnsupportedHttpMethod / handleBadRequest
        assert body == ({"error": f"Incorrect HTTP method for uri [{target}] and method "
                                  f"[{method}], allowed: [POST]", "status": 405}
                        if status == 405 else
                        {"error": f"no handler found for uri [{target}] and method [{method}]"})
        assert r.header("x-elastic-product") == "Elasticsearch"
    elif shape == "tgi":
        assert path in body["error"]
        assert body["error_type"] == ("not_found" if status == 404 else "method_not_allowed")
    else:
        assert body["code"] == status and path in body["error"]


def test_response_head_sanity(gw: Gateway) -> None:
    """RFC 9110 section 6.6.1: an origin server with a clock sends Date; SPEC.md: the
    client's x-request-id is echoed; no field is sent twice (RFC 9110 section 5.3) except the
    repeatable ones."""
    with Conn(gw.addr) as c:
        for stream in (False, True):
            rid = f"wire-head-{stream}"
            c.send(request("POST", CHAT, chat(stream=stream), {"X-Request-Id": rid}))
            r = c.response()
            assert r.status == 200 and r.header("date")
            assert r.all("x-request-id") == [rid]
            names = [k for k, _ in r.headers]
            assert not {n for n in names if names.count(n) > 1} - REPEATABLE, r.headers
        c.send(request("POST", CHAT, chat()))
        assert len(c.response().header("x-request-id") or "") >= 16  # one made when none came
        for status_route in ("/health", "/v1/models", "/info", "/ping"):  # status routes too
            c.send(request("GET", status_route, headers={"X-Request-Id": "status-1"}))
            assert c.response("GET").all("x-request-id") == ["status-1"], status_route
        # RFC 9110 section 5.5: obs-text (bytes 0x80-0xFF) may appear in a field value; the id
        # comes back byte for byte, not re-encoded
        c.send(request("POST", CHAT, chat(), {"X-Request-Id": "caf\xe9-\xff"}))
        assert c.response().all("x-request-id") == ["caf\xe9-\xff"]


@pytest.mark.parametrize(("method", "target", "status", "location"), [
    # Starlette's redirect_slashes: a trailing slash on a fixed route is a 307 to the route (a
    # POST keeps its method and body across a 307); its Location is relative (RFC 9110
    # section 10.2.2), where Starlette's repeated whatever Host the client sent.
    ("POST", CHAT + "/", 307, CHAT),
    ("GET", "/health/", 307, "/health"),
    ("POST", "/predictions/demo/", 307, "/predictions/demo"),
    # Routes match the percent-decoded path (ASGI scope["path"]); even %2F is a slash there.
    ("POST", "/v1/chat/%63ompletions", 200, None),
    ("GET", "/v1/%6Dodels", 200, None),
    ("GET", "/v1%2Fmodels", 200, None),
])
def test_url_forms_as_uvicorn_and_starlette_answer_them(gw: Gateway, method: str, target: str,
                                                        status: int, location: str | None) -> None:
    """Recorded from uvicorn + Starlette (today's main) so that another server layer keeps it."""
    with Conn(gw.addr) as c:
        c.send(request(method, target, chat() if method == "POST" else b""))
        r = c.response(method)
    assert r.status == status, r.body[:300]
    assert r.header("location") == location


def test_fifty_concurrent_streams_all_complete_well_framed(gw: Gateway) -> None:
    """50 connections at once, each one stream: every one complete and chunk-framed."""
    results: list[Response | BaseException] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            with Conn(gw.addr, timeout=20) as c:
                c.send(request("POST", CHAT, chat(stream=True, max_tokens=16),
                               {"X-Request-Id": f"wire-many-{i}"}))
                out: Response | BaseException = c.response()
        except BaseException as exc:  # reported below, with the others
            out = exc
        with lock:
            results.append(out)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 50, f"{50 - len(results)} streams never finished"
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    ids = set()
    for r in results:
        assert isinstance(r, Response)
        assert_stream(r)
        ids.add(r.header("x-request-id"))
    assert len(ids) == 50


@pytest.mark.parametrize("stream", [False, True])
def test_an_h2c_upgrade_offer_is_answered_over_http11_with_its_body(gw: Gateway,
                                                                     stream: bool) -> None:
    """`curl --http2 -d ...` on a plain-http URL sends `Upgrade: h2c` with its POST body
    (RFC 7540 section 3.2; curl 7.88 does). A server that does not switch protocols answers
    over HTTP/1.1 (RFC 9110 section 7.8: it may ignore Upgrade); the body after the head is
    still the request's body, not the new protocol's bytes, and the connection then closes."""
    body = chat(stream=stream)
    with Conn(gw.addr) as c:
        c.send(request("POST", CHAT, body, headers={
            "Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c",
            "HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA"}))
        r = c.response()
        if stream:
            assert_stream(r)
        else:
            assert_whole(r)
        assert c.closed_by_peer(5.0)
