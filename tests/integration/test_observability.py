"""The gateway as a real process in front of a fake worker (a plain HTTP server recording what
it receives): every output line is JSON (the HTTP server's included) with start, ready, drain and stop
events and levels by outcome; the worker sees the client's `traceparent`; and every query of
the Grafana dashboard names metrics and labels that the running gateway exports."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import parser

from tests.integration import procs
from tests.unit.test_metrics import STREAM_USAGE
from tests.unit.test_pipeline_respx import WHOLE_OK

pytestmark = pytest.mark.integration

DASHBOARD = (procs.ROOT / "deploy" / "k8s" / "components" / "monitoring"
             / "gateway-dashboard.json")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
MSG = [{"role": "user", "content": "Hi"}]
IN_FLIGHT_SIM = 'gateway_requests_in_flight{gen_ai_request_model="sim"} 1.0'
# Labels Prometheus adds at scrape time (target labels), not the gateway.
TARGET_LABELS = {"job", "instance", "pod", "namespace", "service", "container", "endpoint"}


class FakeWorker(BaseHTTPRequestHandler):
    """vLLM's chat route, answering canned bytes; every request's headers are kept."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(200, b"", "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        FakeWorker.seen.append({k.lower(): v for k, v in self.headers.items()})
        if body.get("stream"):
            self._answer(200, STREAM_USAGE, "text/event-stream")
        else:
            self._answer(200, WHOLE_OK, "application/json")

    def _answer(self, status: int, body: bytes, media_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", media_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@dataclass
class Run:
    lines: list[str]
    scrape: str
    statuses: dict[str, int]
    worker_headers: list[dict[str, str]]
    exit_code: int


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("observability")
    worker = ThreadingHTTPServer(("127.0.0.1", 0), FakeWorker)
    thread = threading.Thread(target=worker.serve_forever, daemon=True)
    thread.start()
    config = f"""
server: {{drain_seconds: 2}}
default_model: demo
models:
  - {{name: demo, backend: vllm, upstreams: ["http://127.0.0.1:{worker.server_port}"]}}
  - {{name: dead, backend: vllm, upstreams: ["http://127.0.0.1:{procs.free_port()}"]}}
  - {{name: sim, backend: vllm}}
workers:
  - {{kind: simulator, model: sim}}
"""
    try:
        # a Kubernetes service link: the config warning it causes must be JSON too
        proc, url = procs.gateway(tmp, config, env={"GATEWAY_SERVICE_HOST": "10.0.0.1"})
        try:
            statuses = traffic(url)
            scrape = httpx.get(url + "/metrics", timeout=5,
                               headers={"x-request-id": "scrape-id"}).text
        finally:
            code = proc.stop(signal.SIGTERM)
        yield Run(Path(proc.log).read_text().splitlines(), scrape, statuses,
                  list(FakeWorker.seen), code)
    finally:
        worker.shutdown()
        worker.server_close()
        thread.join(5)


def traffic(url: str) -> dict[str, int]:
    out = {}
    with httpx.Client(base_url=url, timeout=10) as client:
        chat = "/v1/chat/completions"
        out["stream"] = client.post(chat, headers={"traceparent": TRACEPARENT}, json={
            "model": "demo", "messages": MSG, "stream": True}).status_code
        out["whole"] = client.post(chat, json={"model": "demo", "messages": MSG}).status_code
        out["unknown"] = client.post(chat, json={"model": "nope", "messages": MSG}).status_code
        out["dead"] = client.post(chat, json={"model": "dead", "messages": MSG}).status_code
        slow = [{"role": "user", "content": "slow [[sim itl_ms=200]]"}]
        with client.stream("POST", chat, json={"model": "sim", "messages": slow, "stream": True,
                                               "max_tokens": 50}) as resp:
            out["gone"] = resp.status_code
            next(resp.iter_lines())  # the first chunk, then the client hangs up
        deadline = time.monotonic() + 10  # until the gateway has seen the disconnect
        while time.monotonic() < deadline and IN_FLIGHT_SIM in client.get("/metrics").text:
            time.sleep(0.05)
        out["models"] = client.get("/v1/models", headers={"x-request-id": "models-id"}
                                   ).status_code
        out["health"] = client.get("/health", headers={"x-request-id": "health-id"}).status_code
        # a path no route takes (a client's base URL one letter off)
        out["no_route"] = client.post("/v1/chat/completion", json={}, headers={
            "x-request-id": "no-route-id"}).status_code
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:  # the server logs this
        raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        raw.recv(1024)
    with socket.create_connection((host, int(port)), timeout=5) as raw:  # refused at the wire
        raw.sendall(b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n"
                    b"x-request-id: wire-refused-id\r\n\r\n")
        out["wire"] = int(raw.recv(1024).split(b" ", 2)[1])
    return out


def test_every_line_is_json_with_lifecycle_events(run: Run) -> None:
    assert run.exit_code in (0, -signal.SIGTERM)
    records = []
    for line in run.lines:
        if line.strip():
            record = json.loads(line)  # fails on any plain-text line
            assert isinstance(record, dict) and {"event", "level", "timestamp"} <= set(record)
            records.append(record)
    events = [r["event"] for r in records]
    order = [events.index(e) for e in ("start", "ready", "drain", "stop")]
    assert order == sorted(order), events
    assert records[events.index("start")]["build"] in ("pure", "compiled")  # which one runs
    warned = records[events.index("config_warning")]
    assert warned["level"] == "warning" and "GATEWAY_SERVICE_HOST" in warned["message"]
    drain = records[events.index("drain")]
    assert drain["signal"] == "SIGTERM" and drain["drain_seconds"] == 2
    # The server's own lines: where it listens (after `ready`), and a request it cannot parse.
    assert events.index("ready") < events.index("listening") < events.index("drain")
    invalid = records[events.index("invalid_http_request")]
    assert invalid["level"] == "warning" and invalid["reason"], invalid
    # The supervisor's lines about its managed worker (whose output, if any, is wrapped too).
    assert {"worker_started", "worker_healthy"} <= {
        r["event"] for r in records if r.get("worker") == "simulator"}


def test_request_lines_are_levelled_by_outcome(run: Run) -> None:
    assert run.statuses == {"stream": 200, "whole": 200, "unknown": 404, "dead": 503,
                            "gone": 200, "models": 200, "health": 200, "no_route": 404,
                            "wire": 400}
    requests = [json.loads(line) for line in run.lines if '"event":"request"' in line]
    by_status = {(r["status"], r["level"]) for r in requests if r["model"] != "sim"}
    assert by_status == {(200, "info"), (404, "info"), (503, "warning")}
    dead = next(r for r in requests if r["status"] == 503)
    # its one upstream failed the probe made at startup: not tried, or tried 3 times (retries)
    # had the request come first
    assert dead["error_type"] == "UpstreamUnavailable"
    assert len(dead.get("upstream_errors", [])) in (0, 3)


def test_the_worker_sees_the_clients_trace_context(run: Run) -> None:
    assert [h.get("traceparent") for h in run.worker_headers] == [TRACEPARENT, None]


def _scraped(text: str) -> dict[str, set[str]]:
    """Sample name -> the label names it carries, from a real scrape."""
    out: dict[str, set[str]] = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def test_dashboard_queries_name_exported_metrics_and_labels(run: Run) -> None:
    scraped = _scraped(run.scrape)
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    assert len(exprs) > 10
    for expr in exprs:
        names = set(re.findall(r"\b([a-z_]+)\s*[{\[]", expr))  # a selector: name{...}[...]
        names.update(re.findall(r"label_values\(([a-z_]+),", expr))
        assert names, expr
        for name in names:
            assert name in scraped, f"{name} (in {expr}) is not exported"
        labels = set(re.findall(r"\b([a-z_]+)\s*(?:=~|!=|=)\s*\"", expr))
        for group in re.findall(r"by \(([^)]*)\)", expr):
            labels.update(x.strip() for x in group.split(","))
        labels.update(re.findall(r"label_values\([a-z_]+, ([a-z_]+)\)", expr))
        have = set().union(*(scraped[n] for n in names)) | TARGET_LABELS
        assert labels <= have, f"{labels - have} not on {names} (in {expr})"


def test_the_hpa_metric_is_exported_per_model(run: Run) -> None:
    families = {f.name: f for f in parser.text_string_to_metric_families(run.scrape)}
    gauge = families["gateway_requests_in_flight"]
    assert gauge.type == "gauge"
    assert {s.labels["gen_ai_request_model"]: s.value for s in gauge.samples} == {
        "demo": 0.0, "dead": 0.0, "sim": 0.0}


def test_a_client_gone_mid_stream_is_counted_and_leaves_flight(run: Run) -> None:
    gone = [s for fam in parser.text_string_to_metric_families(run.scrape) for s in fam.samples
            if s.labels.get("gen_ai_request_model") == "sim"]
    closed = [s for s in gone if s.name == "gen_ai_server_request_duration_seconds_count"
              and s.labels["error_type"] == "client_closed"]
    assert [s.value for s in closed] == [1.0]
    assert closed[0].labels["http_status_class"] == "2xx"  # the head was out already
    assert [s.value for s in gone if s.name == "gateway_requests_in_flight"] == [0.0]
    # its upstream attempt ended with it, tagged the same way
    assert any(s.name == "gen_ai_client_operation_duration_seconds_count"
               and s.labels["error_type"] == "client_closed" for s in gone)


def test_requests_no_route_takes_and_refusals_at_the_wire_have_their_line(run: Run) -> None:
    """SPEC.md: every request gets an id and one structured log line; README: the id is
    echoed in every response, errors, status routes and refusals at the wire included. A
    client whose base URL is one letter off, or whose head the server refuses, is seen in the
    log under the id it was answered with, once."""
    records = [json.loads(line) for line in run.lines if line.strip()]
    (typo,) = [r for r in records if r.get("request_id") == "no-route-id"]
    assert (typo["event"], typo["status"], typo["level"]) == ("request", 404, "info")
    assert typo["path"] == "/v1/chat/completion" and typo["error_type"] == "NoRoute"
    (wire,) = [r for r in records if r.get("request_id") == "wire-refused-id"]
    assert (wire["event"], wire["status"], wire["level"]) == (
        "invalid_http_request", 400, "warning")
    assert "Host" in wire["reason"]


def test_status_routes_have_their_line(run: Run) -> None:
    """SPEC.md: every request gets an id and one structured log line; probes and model lists
    too (vLLM's server logs each `GET /health` in its access log)."""
    records = [json.loads(line) for line in run.lines if line.strip()]
    for rid, path in (("models-id", "/v1/models"), ("health-id", "/health"),
                      ("scrape-id", "/metrics")):
        (line,) = [r for r in records if r.get("request_id") == rid]
        assert (line["event"], line["status"], line["level"], line["path"]) == (
            "request", 200, "info", path)
