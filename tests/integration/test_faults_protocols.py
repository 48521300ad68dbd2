"""The fault grid of SPEC.md "Behaviour under load, faults and bad input", for every client
protocol against a real simulator worker: the gateway's own limit (429 with Retry-After), a
worker slow to start (first_byte: 504), a worker failing before its first byte (503), a worker
cutting its stream (failover_attempts 0: the protocol's in-band error and terminator, never a
silent end) and a client leaving mid-stream (the worker aborts at once). Each answer is checked
for its status, its error body in the calling protocol's shape, its media type and
`x-request-id`. The shapes: OpenAI's error object, LMI's `{"error", "code"}` (seed 003), TGI's
`{"error", "error_type"}` (router server.rs ErrorResponse), Elasticsearch's error body
(ElasticsearchException.generateFailureXContent) or its `event: error` on a stream
(ServerSentEventsRestActionListener.onFailure).
"""

from __future__ import annotations

import dataclasses
import http.server
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from tests.integration import procs

pytestmark = pytest.mark.integration

TIMEOUT = 15.0
MSG = "hello"


@dataclass(frozen=True)
class Proto:
    """A client protocol's route: its request body and how its errors and streams look."""

    path: str
    body: Callable[[str, bool], dict[str, Any]]
    shape: str  # openai | lmi | tgi | elastic: its error body
    always_streams: bool = False  # the route streams whatever the body says
    never_streams: bool = False
    inband_before_first_byte: bool = False  # TGI streams: 200 and an error event (server.rs)
    events: str = "sse"  # sse | lines: how its stream is framed


def _chat(model: str) -> Callable[[str, bool], dict[str, Any]]:
    return lambda text, stream: {"model": model, "messages": [{"role": "user", "content": text}],
                                 "max_tokens": 6, "stream": stream}


def _inputs(text: str, stream: bool) -> dict[str, Any]:
    return {"inputs": text, "parameters": {"max_new_tokens": 6}, "stream": stream}


PROTOS = {
    "openai-chat": Proto("/v1/chat/completions", _chat("demo"), "openai"),
    "openai-completions": Proto(
        "/v1/completions",
        lambda t, s: {"model": "demo", "prompt": t, "max_tokens": 6, "stream": s}, "openai"),
    "lmi-inputs": Proto("/invocations", _inputs, "lmi", events="lines"),
    "lmi-inputs-sse": Proto("/predictions/sse", _inputs, "lmi"),
    "lmi-tgi-compat": Proto("/predictions/compat", _inputs, "lmi"),
    "lmi-messages": Proto(
        "/invocations", lambda t, s: {"messages": [{"role": "user", "content": t}],
                                      "max_tokens": 6, "stream": s}, "lmi", events="lines"),
    "lmi-prompt": Proto("/invocations",
                        lambda t, s: {"prompt": t, "max_tokens": 6, "stream": s}, "lmi"),
    "tgi-generate": Proto("/generate", lambda t, s: {"inputs": t,
                                                     "parameters": {"max_new_tokens": 6}},
                          "tgi", never_streams=True),
    "tgi-generate-stream": Proto("/generate_stream",
                                 lambda t, s: {"inputs": t, "parameters": {"max_new_tokens": 6}},
                                 "tgi", always_streams=True, inband_before_first_byte=True),
    "tgi-root": Proto("/", _inputs, "tgi", inband_before_first_byte=True),
    "tgi-messages": Proto("/v1/chat/completions", _chat("tgi"), "tgi",
                          inband_before_first_byte=True),
    "elastic-unified": Proto("/_inference/chat_completion/demo/_stream",
                             lambda t, s: {"messages": [{"role": "user", "content": t}],
                                           "max_completion_tokens": 6},
                             "elastic", always_streams=True),
    "elastic-completion": Proto("/_inference/completion/demo",
                                lambda t, s: {"input": t}, "elastic", never_streams=True),
    "elastic-completion-stream": Proto("/_inference/completion/demo/_stream",
                                       lambda t, s: {"input": t}, "elastic",
                                       always_streams=True),
}
STREAMING = [k for k, p in PROTOS.items() if not p.never_streams]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = procs.simulator(tmp_path_factory.mktemp("grid-sim"))
    try:
        yield url
    finally:
        proc.stop()


def _config(sim: str, server: str) -> str:
    return f"""
server: {{{server}, health: {{eject_after: 1000}}}}  # faults on purpose: never ejected
default_model: demo
models:
  - {{name: demo, upstreams: [{sim}]}}
  - {{name: sse, upstream_model: demo, upstreams: [{sim}], lmi: {{output_formatter: sse}}}}
  - {{name: compat, upstream_model: demo, upstreams: [{sim}], lmi: {{tgi_compat: true}}}}
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, sim: str) -> Iterator[str]:
    proc, url = procs.gateway(tmp_path_factory.mktemp("grid-gw"), _config(
        sim, "retries: 1, failover_attempts: 0, max_request_bytes: 4096, "
        "timeouts: {first_byte: 1, idle: 1, request_read: 1}"))
    try:
        yield url
    finally:
        proc.stop()


def post(url: str, proto: Proto, text: str, stream: bool) -> httpx.Response:
    body = proto.body(text, stream)
    return httpx.post(url + proto.path, content=orjson.dumps(body),
                      headers={"content-type": "application/json", "x-request-id": "grid-1"},
                      timeout=TIMEOUT)


def check_error_body(proto: Proto, resp: httpx.Response, status: int,
                     rest_layer: bool | None = None) -> str:
    """The error answer before any byte, in the protocol's own shape; its message.
    `rest_layer`: Elasticsearch refuses it before its SSE listener (default: by the status)."""
    assert resp.headers["x-request-id"] == "grid-1"
    if proto.inband_before_first_byte:
        assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
        errs = [e["error"] for e in last_events(proto, resp.content) if isinstance(e, dict)]
        assert len(errs) == 1, resp.text  # the one event (TGI chat: then `data: [DONE]`)
        return str(errs[0]["message"] if isinstance(errs[0], dict) else errs[0])
    assert resp.status_code == status, resp.text
    # Elasticsearch streams a failure of the inference action as `event: error`; one of its
    # REST layer (a rejected execution: 429; a body too large or too slow) its JSON error body
    if rest_layer is None:
        rest_layer = status in (408, 413, 429)
    if proto.always_streams and proto.shape == "elastic" and not rest_layer:
        assert resp.headers["content-type"] == "text/event-stream"
        assert resp.text.startswith("event: error\ndata: ")
        return str(orjson.loads(resp.text.split("data: ", 1)[1])["error"])
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    if proto.shape == "openai":
        assert set(body["error"]) == {"message", "type", "param", "code"}
        return str(body["error"]["message"])
    if proto.shape == "lmi":
        assert set(body) == {"error", "code"} and body["code"] == status
        return str(body["error"])
    if proto.shape == "tgi":
        assert set(body) == {"error", "error_type"}
        return str(body["error"])
    assert set(body) == {"error", "status"} and body["status"] == status
    assert {"root_cause", "type", "reason"} <= set(body["error"])
    return str(body["error"]["reason"])


def before_body(name: str, status: int) -> Proto:
    """How a route answers a refusal before its body is read (too many requests in flight, a
    body too large): `/` with TGI's JSON error whatever `stream` would have said, TGI's
    Messages API as the OpenAI route it shares. /generate_stream tells an overload in its
    stream as TGI does (server.rs generate_stream_internal), but a body past the limit is
    refused before the handler (axum's DefaultBodyLimit): a JSON answer."""
    if name == "tgi-messages":
        return PROTOS["openai-chat"]
    if name == "tgi-root" or (name == "tgi-generate-stream" and status in (408, 413)):
        return PROTOS["tgi-generate"]
    return PROTOS[name]


def last_events(proto: Proto, raw: bytes) -> list[Any]:
    """The parsed payloads of a stream's events (`[DONE]` as the string)."""
    if proto.events == "lines":
        return [orjson.loads(line) for line in raw.split(b"\n") if line]
    out: list[Any] = []
    for event in raw.split(b"\n\n"):
        data = [ln[6:] for ln in event.split(b"\n") if ln.startswith(b"data: ")]
        if data:
            out.append("[DONE]" if data[0] == b"[DONE]" else orjson.loads(data[0]))
    return out


def inband_error(proto: Proto, name: str, raw: bytes) -> None:
    """How each protocol ends a stream its worker broke: its error event and terminator."""
    events = last_events(proto, raw)
    if name in ("openai-chat", "openai-completions", "lmi-prompt", "tgi-messages"):
        # vLLM serving_chat/serving_completion: the error object, then `data: [DONE]`;
        # TGI's chat stream: {"error":{"message","http_status_code"}}, then [DONE] too
        assert events[-1] == "[DONE]" and "message" in events[-2]["error"], events[-2:]
    elif name in ("lmi-inputs", "lmi-inputs-sse", "lmi-tgi-compat"):
        # seed 003: the error line, finish_reason "error" and the token id -1
        assert events[-1]["details"]["finish_reason"] == "error"
        assert events[-1]["token"]["id"] == -1 and events[-1]["generated_text"] == ""
    elif name == "lmi-messages":
        assert events[-1]["choices"][0]["finish_reason"] == "error"
    elif name in ("tgi-generate-stream", "tgi-root"):
        assert events[-1]["error_type"] == "generation"  # server.rs: the event, no [DONE]
    else:  # Elasticsearch: the `event: error` that ends the stream
        assert raw.rsplit(b"\n\n", 2)[-2].startswith(b"event: error\ndata: ")


@pytest.mark.parametrize("name", list(PROTOS))
def test_a_worker_slow_to_start_is_a_504(gw: str, name: str) -> None:
    """Elasticsearch's routes: its inference timeout's 408 (elastic_encode.es_status)."""
    proto = PROTOS[name]
    resp = post(gw, proto, f"[[sim ttft_ms=3000]] {MSG}", not proto.never_streams)
    status = 408 if proto.shape == "elastic" else 504
    assert "nothing within 1s" in check_error_body(proto, resp, status, rest_layer=False)


@pytest.mark.parametrize("name", list(PROTOS))
def test_a_worker_failing_before_its_first_byte_is_a_503(gw: str, name: str) -> None:
    proto = PROTOS[name]
    resp = post(gw, proto, f"[[sim fail=503]] {MSG}", not proto.never_streams)
    assert "Simulated failure" in check_error_body(proto, resp, 503)


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
@pytest.mark.parametrize("name", list(PROTOS))
def test_a_body_over_max_request_bytes_is_413(gw: str, name: str, chunked: bool) -> None:
    proto = PROTOS[name]
    body = orjson.dumps(proto.body("x" * 5000, not proto.never_streams))
    content: bytes | Iterator[bytes] = iter([body[:2000], body[2000:]]) if chunked else body
    resp = httpx.post(gw + proto.path, content=content, timeout=TIMEOUT,
                      headers={"content-type": "application/json", "x-request-id": "grid-1"})
    assert "4096 bytes" in check_error_body(before_body(name, 413), resp, 413)


def test_a_body_that_stops_arriving_is_a_408_in_every_protocol(gw: str) -> None:
    """timeouts.request_read (1 s here): a client whose body stops short is answered 408 in
    its protocol's error body (before the body is whole: as `before_body` says)."""
    host, port = gw.removeprefix("http://").split(":")
    answers: dict[str, bytes] = {}

    def stall(name: str) -> None:
        proto = PROTOS[name]
        body = orjson.dumps(proto.body(MSG, not proto.never_streams))
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as sock:
            sock.sendall(f"POST {proto.path} HTTP/1.1\r\nHost: gw\r\nX-Request-Id: grid-1\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + body[:-3])
            answers[name] = b"".join(iter(lambda: sock.recv(65536), b""))

    threads = [threading.Thread(target=stall, args=(n,)) for n in PROTOS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    for name, raw in answers.items():
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(ln.lower().split(": ", 1) for ln in lines[1:])
        resp = httpx.Response(int(lines[0].split()[1]), headers=headers, content=body)
        assert "did not arrive within 1s" in check_error_body(before_body(name, 408), resp, 408)
    assert len(answers) == len(PROTOS)


@pytest.mark.parametrize("fault", ["drop_after=2", "error_after=2", "hang_after=2"])
@pytest.mark.parametrize("name", STREAMING)
def test_a_stream_cut_by_its_worker_ends_with_the_in_band_error(gw: str, name: str,
                                                                fault: str) -> None:
    proto = PROTOS[name]
    started = time.monotonic()
    resp = post(gw, proto, f"[[sim {fault} tokens=20]] {MSG}", True)
    assert time.monotonic() - started < 1 + 3  # the idle timeout at most
    assert resp.status_code == 200 and resp.headers["x-request-id"] == "grid-1"
    inband_error(proto, name, resp.content)


@pytest.fixture(scope="module")
def small_gw(tmp_path_factory: pytest.TempPathFactory, sim: str) -> Iterator[str]:
    proc, url = procs.gateway(tmp_path_factory.mktemp("grid-small"),
                              _config(sim, "max_concurrent_requests: 2"))
    try:
        yield url
    finally:
        proc.stop()


def test_past_max_concurrent_requests_every_protocol_gets_429_with_retry_after(
        small_gw: str) -> None:
    """Two requests that wait on their worker's first token hold both places (seen in the
    in-flight gauge, not assumed after a sleep) for as long as every protocol is asked; they
    end when their clients close."""
    body = orjson.dumps(_chat("demo")("[[sim ttft_ms=60000]] hold", False))
    host, port = small_gw.removeprefix("http://").split(":")
    holders = []
    try:
        for _ in range(2):
            sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
            holders.append(sock)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                         b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body))
        assert _in_flight_within(small_gw, 2, TIMEOUT)  # both places taken
        for name, proto in PROTOS.items():
            resp = post(small_gw, proto, MSG, not proto.never_streams)
            assert resp.headers.get("retry-after"), name
            proto = before_body(name, 429)
            assert "too many requests" in check_error_body(proto, resp, 429) or (
                proto.shape == "tgi" and "overloaded" in resp.text), (name, resp.text)
    finally:
        for sock in holders:
            sock.close()
    assert _in_flight_within(small_gw, 0, TIMEOUT)  # the places are given back


def _in_flight_within(url: str, n: int, seconds: float) -> bool:
    """Whether the gateway's requests in flight reach `n` within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
        values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("gateway_requests_in_flight{")]
        if sum(values) == n:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("name", STREAMING)
def test_a_client_leaving_mid_stream_aborts_the_worker(gw: str, sim: str, name: str) -> None:
    proto = PROTOS[name]
    httpx.post(sim + "/_sim/reset", timeout=5)
    body = orjson.dumps(proto.body(f"[[sim itl_ms=100 tokens=200]] {MSG}", True))
    with httpx.Client(timeout=TIMEOUT) as client:
        with client.stream("POST", gw + proto.path, content=body,
                           headers={"content-type": "application/json"}) as resp:
            assert resp.status_code == 200
            next(resp.iter_raw())  # the generation is under way
            left_at = time.time()
    stats: dict[str, Any] = {}
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        stats = httpx.get(sim + "/_sim/stats", timeout=5).json()
        if stats["aborted"] >= 1:
            break
        time.sleep(0.02)
    assert stats["aborted"] == 1 and stats["active"] == 0, stats
    assert stats["last_abort_at"] - left_at < 1.0


class RateLimited(http.server.BaseHTTPRequestHandler):
    """A worker behind a rate limiter: healthy, and every generation is a 429 with the
    limiter's Retry-After and OpenAI's rate-limit body (openai-python RateLimitError)."""

    def do_GET(self) -> None:
        self._answer(200, b'{"object":"list","data":[]}', {})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._answer(429, orjson.dumps({"error": {
            "message": "Rate limit reached for requests", "type": "requests", "param": None,
            "code": "rate_limit_exceeded"}}), {"retry-after": "7"})

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in {**headers, "content-type": "application/json",
                            "content-length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def limited_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    worker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RateLimited)
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    proc, url = procs.gateway(tmp_path_factory.mktemp("grid-limited"), _config(
        f"http://127.0.0.1:{worker.server_address[1]}", "retries: 1"))
    try:
        yield url
    finally:
        proc.stop()
        worker.shutdown()
        worker.server_close()
        thread.join(TIMEOUT)


@pytest.mark.parametrize("stream", [False, True])
def test_a_rate_limited_workers_retry_after_reaches_every_protocol(limited_gw: str,
                                                                   stream: bool) -> None:
    """Every worker answering 429 is the client's 429 with the worker's own Retry-After
    (RFC 9110 section 10.2.3), which openai-python waits before its retry
    (_base_client.py `_calculate_retry_timeout`), where it would otherwise back off on its
    own; TGI's routes tell it as TGI's overload (server.rs: 429 "Model is overloaded")."""
    for name, proto in PROTOS.items():
        if (proto.never_streams and stream) or (proto.always_streams and not stream):
            continue
        resp = post(limited_gw, proto, MSG, stream)
        assert resp.headers.get("retry-after") == "7", (name, resp.headers)
        # Elasticsearch: the inference action failed (its stream's `event: error`), not a
        # rejection by its REST layer
        shown = dataclasses.replace(proto, inband_before_first_byte=stream
                                    and proto.inband_before_first_byte)
        message = check_error_body(shown, resp, 429, rest_layer=False)
        assert "Rate limit reached for requests" in message or message == "Model is overloaded", \
            (name, message)
