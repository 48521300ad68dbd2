"""Faults against real processes: retries across upstreams, all upstreams down, the client
disconnecting mid-stream, and the embedded default (`gateway serve` with no config)."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.integration import procs, rawhttp

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = procs.simulator(tmp_path_factory.mktemp("faults-sim"))
    try:
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, sim: str) -> Iterator[str]:
    dead = f"http://127.0.0.1:{procs.free_port()}"  # nothing listens there
    proc, url = procs.gateway(tmp_path_factory.mktemp("faults-gw"), f"""
server: {{retries: 2, timeouts: {{first_byte: 10, idle: 5}}}}
default_model: flaky
models:
  - name: flaky
    upstreams: [{dead}, {sim}]
  - name: single
    upstreams: [{sim}]
  - name: down
    upstreams: [{dead}]
""")
    try:
        yield url
    finally:
        proc.stop()


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)


def test_dead_first_upstream_then_success_on_the_second(gw: str) -> None:
    for _ in range(4):  # round robin starts on each upstream in turn; every call succeeds
        r = sdk(gw).chat.completions.create(model="flaky", messages=MSG, max_tokens=3)
        assert r.choices[0].message.content


def test_worker_refusing_before_first_byte_is_retried(gw: str, sim: str) -> None:
    msgs = [{"role": "user", "content": "x [[sim fail=503 fail_times=1]]"}]
    chunks = list(sdk(gw).chat.completions.create(model="single", messages=msgs, max_tokens=3,
                                                   stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_all_upstreams_down_is_503_in_openai_error_body(gw: str) -> None:
    resp = httpx.post(gw + "/v1/chat/completions", timeout=20,
                      json={"model": "down", "messages": MSG, "stream": True})
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "upstream_unavailable"
    with pytest.raises(openai.InternalServerError):
        sdk(gw).chat.completions.create(model="down", messages=MSG)


def test_client_disconnect_closes_the_worker_connection_within_a_second(gw: str,
                                                                         sim: str) -> None:
    httpx.post(sim + "/_sim/reset", timeout=5)
    body = {"model": "single", "stream": True, "max_tokens": 500,
            "messages": [{"role": "user", "content": "slow [[sim itl_ms=200 tokens=500]]"}]}
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", gw + "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break  # a token arrived: the generation is under way
            closed_at = time.time()
    deadline = time.monotonic() + 3
    stats: dict[str, float] = {}
    while time.monotonic() < deadline:
        stats = httpx.get(sim + "/_sim/stats", timeout=2).json()
        if stats["aborted"] >= 1:
            break
        time.sleep(0.02)
    assert stats["aborted"] >= 1, stats
    assert stats["last_abort_at"] - closed_at < 1.0
    assert stats["active"] == 0


def test_a_client_gone_while_its_whole_answer_is_prefilled_aborts_the_worker(
        gw: str, sim: str) -> None:
    """SPEC.md (Reliability): a client that disconnects closes the upstream request at once,
    even before the first byte of its answer. TCP cannot tell a closed client from one that
    only shut its write side (`shutdown(SHUT_WR)`): the server takes the end of the request
    stream as the client gone, as uvicorn, nginx (`proxy_ignore_client_abort off`) and hyper
    (`http1_half_close` off by default) do, and keeps the worker's GPU free."""
    httpx.post(sim + "/_sim/reset", timeout=5)
    body = {"model": "single", "max_tokens": 8,
            "messages": [{"role": "user", "content": "[[sim ttft_ms=20000]]"}]}
    host, port = gw.removeprefix("http://").split(":")
    with rawhttp.Conn((host, int(port))) as c:
        c.send(rawhttp.request("POST", "/v1/chat/completions", json.dumps(body).encode()))
        deadline = time.monotonic() + 5
        while httpx.get(sim + "/_sim/stats", timeout=2).json()["active"] < 1:
            assert time.monotonic() < deadline, "the request never reached the worker"
            time.sleep(0.02)
        c.sock.shutdown(socket.SHUT_WR)  # the end of what the client sends; then gone
    deadline = time.monotonic() + 5
    while (stats := httpx.get(sim + "/_sim/stats", timeout=2).json())["aborted"] < 1:
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)
    assert stats["active"] == 0


def test_default_serve_runs_demo_on_a_managed_simulator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SPEC.md, Command line: without --config, model `demo` on a managed simulator "on a
    free loopback port, so two default gateways never clash": a second one serves too."""
    proc, url = procs.gateway(tmp_path, None)
    try:
        other, other_url = procs.gateway(tmp_path, None)
        try:
            r = sdk(other_url).chat.completions.create(model="demo", messages=MSG, max_tokens=2)
            assert r.choices[0].message.content and procs.children_of(other.pid)
        finally:
            assert other.stop(signal.SIGTERM) == 0
        r = sdk(url).chat.completions.create(model="demo", messages=MSG, max_tokens=3)
        assert r.choices[0].message.content and r.model == "demo"
        workers = procs.children_of(proc.pid)
        assert workers, "the managed simulator should be a child of the gateway"
    finally:
        code = proc.stop(signal.SIGTERM)
    assert code == 0  # a clean shutdown after the drain
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(procs.alive(p) for p in workers):
        time.sleep(0.05)
    assert not any(procs.alive(p) for p in workers), "the worker outlived the gateway"
    assert '"event":"worker_healthy"' in proc.output()


def test_sigterm_lets_an_in_flight_stream_finish(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SPEC: on SIGTERM stop accepting, finish in-flight streams within the grace period."""
    import threading

    proc, url = procs.gateway(tmp_path, None)
    body = {"model": "demo", "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "slow [[sim itl_ms=150]]"}]}
    lines: list[str] = []
    try:
        with httpx.Client(timeout=10) as client:
            with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                it = resp.iter_lines()
                lines.append(next(it))
                threading.Timer(0.05, proc.popen.send_signal, (signal.SIGTERM,)).start()
                lines.extend(it)
        deadline = time.monotonic() + 10
        while proc.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        exited_by_itself = proc.popen.poll() is not None  # the SIGTERM was taken
    finally:
        code = proc.stop(signal.SIGTERM)
    assert exited_by_itself
    events = [ln for ln in lines if ln.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events)
    assert sum('"content":"' in e and '"content":""' not in e for e in events) == 8
    assert code in (0, -signal.SIGTERM)


DRAIN_CONFIG = """
server: {drain_seconds: 1}
default_model: demo
models:
  - {name: demo, backend: vllm}
workers:
  - {kind: simulator, model: demo}
"""


def test_a_stream_the_drain_time_runs_out_on_ends_in_band(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SPEC: never a silent truncation, shutdown included. A stream still running when
    `server.drain_seconds` ends gets the protocol's in-band error, `[DONE]` and the last chunk
    before its connection closes; its log line says `shutdown`, not `client_closed`."""
    proc, url = procs.gateway(tmp_path, DRAIN_CONFIG)
    host, port = url.removeprefix("http://").split(":")
    body = rawhttp.chat(stream=True, content="slow [[sim itl_ms=100]]", max_tokens=200)
    try:
        with rawhttp.Conn((host, int(port))) as c:
            c.send(rawhttp.request("POST", rawhttp.CHAT, body, {"X-Request-Id": "cut-by-drain"}))
            assert c.head().status == 200
            c.first_chunk()
            proc.popen.send_signal(signal.SIGTERM)
            started = time.monotonic()
            rest = b"".join(c.chunks_to_end())  # each recv bounded by rawhttp.TIMEOUT
            assert time.monotonic() - started < 1 + 3  # drain_seconds, then the cut at once
            assert c.buf == b"" and c.closed_by_peer(2.0)
        assert rest.endswith(b"data: [DONE]\n\n"), rest[-300:]
        assert b'"error"' in rest and b"shutting down" in rest, rest[-300:]
        proc.popen.wait(10)
    finally:
        proc.stop(signal.SIGTERM)
    lines = [ln for ln in proc.log.read_text().splitlines() if '"cut-by-drain"' in ln]
    assert len(lines) == 1 and '"outcome":"shutdown"' in lines[0], lines
