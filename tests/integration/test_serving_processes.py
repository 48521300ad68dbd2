"""`server.workers: 2`: two serving processes on one port, the managed worker started once and
healthy in both, metrics summed over both, and SIGTERM to the parent stopping every process."""

from __future__ import annotations

import errno
import http.client
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from elasticsearch import Elasticsearch
from huggingface_hub import InferenceClient

from gateway import cli, config, processes
from tests.integration import procs, rawhttp

pytestmark = pytest.mark.integration

CONFIG = """\
server: {workers: 2, drain_seconds: 2}
default_model: demo
models: [{name: demo, backend: vllm}]
workers: [{kind: simulator, model: demo, args: [--ttft-ms, "0", --itl-ms, "0"]}]
"""
REQUESTS = 40


def request_pids(log: str) -> list[int]:
    """The `pid` of every completion request's log line (not the start-up's health polls)."""
    out = []
    for line in log.splitlines():
        if line.startswith("{") and '"event":"request"' in line:
            record = json.loads(line)
            if record["path"] == "/v1/completions":
                out.append(int(record["pid"]))
    return out


def served_total(metrics_text: str) -> float:
    return sum(float(m) for m in re.findall(
        r'^gen_ai_server_request_duration_seconds_count\{[^}]*http_route="/v1/completions"'
        r'[^}]*\} ([0-9.e+]+)$', metrics_text, re.M))


def attempts_total(metrics_text: str) -> float:
    """Attempts on the listed upstreams, which the scrape's filter of gone upstreams keeps."""
    return sum(float(m) for m in re.findall(
        r'^gateway_upstream_attempts_total\{[^}]*upstream="http://127\.0\.0\.1:\d+"'
        r'[^}]*\} ([0-9.e+]+)$', metrics_text, re.M))


def test_two_processes_share_the_port_and_stop_together(tmp_path: Path) -> None:
    gw, url = procs.gateway(tmp_path, CONFIG)
    try:
        children = procs.children_of(gw.pid)
        sims = [p for p in children if "simulator" in Path(f"/proc/{p}/cmdline").read_text()]
        serving = [p for p in children if p not in sims]
        assert len(sims) == 1, children  # the managed worker runs once, in the parent
        body = {"model": "demo", "prompt": "hi", "max_tokens": 3}
        for _ in range(REQUESTS):  # a new connection each: the kernel spreads them
            with httpx.Client(timeout=10) as client:
                assert client.post(url + "/v1/completions", json=body).status_code == 200
        metrics_text = httpx.get(url + "/metrics", timeout=10).text
        rss = [int(procs.status(p, "VmRSS").split()[0]) * 1024 for p in serving]
        deadline = time.monotonic() + 10
        while len(request_pids(gw.log.read_text())) < REQUESTS and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = request_pids(gw.log.read_text())
    finally:
        code = gw.stop(grace=20)
    assert len(pids) == REQUESTS
    assert set(pids) <= set(serving) and len(set(pids)) == 2  # served by both processes
    assert served_total(metrics_text) == REQUESTS  # summed over both processes
    assert attempts_total(metrics_text) == REQUESTS
    # the process metrics (the deploy dashboard's CPU and memory per pod): the gateway's
    # processes summed, more than any one of them holds
    resident = re.search(r"^process_resident_memory_bytes (\S+)$", metrics_text, re.M)
    assert resident is not None and float(resident.group(1)) > 2 * max(rss)
    assert re.search(r"^process_cpu_seconds_total \S+$", metrics_text, re.M)
    assert code == 0
    deadline = time.monotonic() + 10
    while any(procs.alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in children if procs.alive(p)]  # SIGTERM stopped every child


def test_sigterm_refuses_new_connections_while_streams_drain(tmp_path: Path) -> None:
    """SPEC.md: on SIGTERM stop accepting and let in-flight streams finish. With two serving
    processes the parent holds the listening sockets too: closed with the signal, or a new
    client's handshake completes and it waits out the drain for a reset. Streams in flight in
    both processes all end whole, the gateway exits 0 and no process of it is left (the
    managed worker stopped). Workers set by the environment override (SPEC.md)."""
    gw, url = procs.gateway(tmp_path, CONFIG.replace("workers: 2, drain_seconds: 2",
                                                     "drain_seconds: 8"),
                            env={"GATEWAY_SERVER__WORKERS": "2"})
    host, port = url.removeprefix("http://").split(":")
    everyone = procs.children_of(gw.pid)
    body = json.dumps({"model": "demo", "prompt": "slow [[sim itl_ms=100]]", "max_tokens": 30,
                       "stream": True}).encode()
    streams: dict[int, rawhttp.Conn] = {}  # by the serving process that holds it
    try:
        for _ in range(30):  # new connections until both processes hold one
            conn = rawhttp.Conn((host, int(port)), timeout=10)
            conn.send(rawhttp.request("POST", "/v1/completions", body,
                                      {"Content-Type": "application/json"}))
            assert conn.head().status == 200 and conn.first_chunk().startswith(b"data: ")
            pid = procs.holder(int(port), conn.sock.getsockname()[1], everyone)
            assert pid is not None
            if pid in streams or len(streams) == 2:
                conn.close()
            else:
                streams[pid] = conn
            if len(streams) == 2:
                break
        assert len(streams) == 2
        gw.popen.send_signal(signal.SIGTERM)
        assert procs.refused_within(host, int(port), 10)  # once every process has the signal
        for conn in streams.values():
            rest = b"".join(conn.chunks_to_end())
            assert rest.rstrip().endswith(b"data: [DONE]") and b'"error"' not in rest
        assert gw.popen.wait(15) == 0
    finally:
        for conn in streams.values():
            conn.close()
        gw.stop()
    deadline = time.monotonic() + 10
    while any(procs.alive(p) for p in everyone) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in everyone if procs.alive(p)]


def test_a_gateway_killed_while_it_starts_leaves_no_process(tmp_path: Path) -> None:
    """The parent SIGKILLed while its serving processes still start (an interpreter and its
    imports): each asks to die with its parent (PR_SET_PDEATHSIG), but a parent already gone
    sends nothing, so each checks its parent's pid after asking (prctl(2): "the caller should
    check getppid()"). Before, they went on to serve the port, orphans."""
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(CONFIG)
    gw = procs.Proc([sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--host",
                     "127.0.0.1", "--port", str(procs.free_port())], tmp_path / "gateway.log")
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            seen |= set(procs.children_of(gw.pid))
            if sum("spawn_main" in procs.cmdline(p) for p in seen) >= 2:
                break
            time.sleep(0.01)
        gw.popen.kill()
        gw.popen.wait(10)
        # each checks once its imports are done: seconds on a loaded host (seen: over 10)
        deadline = time.monotonic() + 60
        while any(procs.alive(p) for p in seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in seen if procs.alive(p)]
    finally:
        gw.stop()
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert len(seen) >= 2 and not left


def test_workers_setting_and_flag() -> None:
    assert config.Config.model_validate({"server": {"workers": "auto"}}).server.workers == "auto"
    assert processes.count("auto") >= 1 and processes.count(3) == 3
    with pytest.raises(ValueError):
        config.Config.model_validate({"server": {"workers": 0}})
    assert cli.parser().parse_args(["serve", "--workers", "auto"]).workers == "auto"
    assert cli.parser().parse_args(["serve", "--workers", "2"]).workers == 2
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["serve", "--workers", "0"])


def test_a_second_gateway_cannot_join_the_port_of_one_with_several_processes() -> None:
    """SO_REUSEPORT admits any socket of the same user that sets it too: a second gateway
    with `workers: 2` started on a busy port would silently take half its connections. It is
    refused as in use, as a gateway of one process is; a port that is free still binds."""
    first = processes.listeners("127.0.0.1", 0, 2)
    try:
        port = first[0].getsockname()[1]
        with pytest.raises(OSError) as refused:
            processes.listeners("127.0.0.1", port, 2)
        assert refused.value.errno == errno.EADDRINUSE
        with pytest.raises(OSError):
            processes.listeners("0.0.0.0", port, 2)
    finally:
        for s in first:
            s.close()
    again = processes.listeners("127.0.0.1", port, 2)  # free again: binds, both sockets
    try:
        assert {s.getsockname()[1] for s in again} == {port}
    finally:
        for s in again:
            s.close()


def fresh_get(url: str, path: str) -> tuple[int, str]:
    """GET `path` on a connection of its own (the kernel spreads new connections over the
    processes by their address hash). http.client, not a new httpx.Client each time: that
    builds a TLS context per client, about 0.1 s of CPU on a loaded runner, and 24 of them
    outlasted the 3 s ejection the test looks at."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def health_and_gauges(url: str, times: int) -> tuple[set[int], set[str]]:
    """/health statuses and `gateway_upstream_healthy` values, each on a new connection."""
    statuses, gauges = set(), set()
    for _ in range(times):
        statuses.add(fresh_get(url, "/health")[0])
        gauges |= {line.rsplit(" ", 1)[1] for line in fresh_get(url, "/metrics")[1]
                   .splitlines() if line.startswith("gateway_upstream_healthy{")}
    return statuses, gauges


def test_an_ejection_in_one_process_holds_in_every_process(tmp_path: Path) -> None:
    """The sidecar topology with two serving processes: a request failing on the one upstream
    (and its retries) ejects it in the process that served it; every process then answers
    /health 503 and shows the gauge at 0, and all are ready again once the probe restores it
    (SPEC.md: /health is 200 only while the default model has a healthy upstream)."""
    sim, sim_url = procs.simulator(tmp_path, "--tokens", "3")
    gw, url = procs.gateway(tmp_path, f"""
server: {{workers: 2, retries: 2, health: {{eject_after: 3, backoff: 3, probe_interval: 0.5}}}}
default_model: demo
models: [{{name: demo, backend: vllm, upstreams: [{sim_url}]}}]
""")
    try:
        deadline = time.monotonic() + 10  # both processes up and past their first probe
        while health_and_gauges(url, 6) != ({200}, {"1.0"}) and time.monotonic() < deadline:
            time.sleep(0.1)
        bad = httpx.post(url + "/v1/chat/completions", timeout=10, json={
            "model": "demo", "messages": [{"role": "user", "content": "x [[sim fail=503]]"}]})
        assert bad.status_code == 503
        assert health_and_gauges(url, 12) == ({503}, {"0.0"})
        deadline = time.monotonic() + 8
        while health_and_gauges(url, 1) != ({200}, {"1.0"}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert health_and_gauges(url, 12) == ({200}, {"1.0"})
    finally:
        gw.stop()
        sim.stop()


def test_a_managed_worker_that_exits_is_out_of_every_process_at_once(tmp_path: Path) -> None:
    """The parent runs the managed worker and sees it exit; every serving process takes it out
    of rotation then, not after its own probes fail (3 probes 5 s apart): /health is 503 in
    all of them within a second, with no traffic to notice it (SPEC.md: /health is 200 only
    while the default model has a healthy upstream)."""
    gw, url = procs.gateway(tmp_path, """
server: {workers: 2}
default_model: demo
models: [{name: demo, backend: vllm}]
workers: [{kind: simulator, model: demo, restart: never}]
""")
    try:
        sims = [p for p in procs.children_of(gw.pid)
                if "simulator" in Path(f"/proc/{p}/cmdline").read_text()]
        deadline = time.monotonic() + 10  # both processes have gated the worker in
        while health_and_gauges(url, 6)[0] != {200} and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(sims[0], signal.SIGKILL)
        deadline = time.monotonic() + 3
        while health_and_gauges(url, 1)[0] != {503} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert health_and_gauges(url, 12)[0] == {503}
    finally:
        gw.stop()


# One gateway for the cases below: two serving processes, the stable keys an independent
# suite sets, a managed worker (model `demo`) and a static upstream (model `static`).
KEY = "sekret"
LIMIT = 3  # server.max_concurrent_requests
MSG = [{"role": "user", "content": "hello"}]
SLOW = "hold [[sim tokens=300 itl_ms=100]]"  # 30 s unless closed


class Gateway:
    def __init__(self, proc: procs.Proc, url: str):
        self.proc, self.url = proc, url
        self.port = int(url.rsplit(":", 1)[1])

    def serving(self) -> list[int]:
        return [p for p in procs.children_of(self.proc.pid)
                if "spawn_main" in procs.cmdline(p) and procs.alive(p)]

    def hold(self) -> rawhttp.Conn:
        """A stream kept open: one place taken until the connection closes."""
        conn = rawhttp.Conn(("127.0.0.1", self.port), timeout=10)
        body = json.dumps({"model": "demo", "prompt": SLOW, "max_tokens": 300, "stream": True})
        conn.send(rawhttp.request("POST", "/v1/completions", body.encode(), {
            "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}))
        assert conn.head().status == 200 and conn.first_chunk().startswith(b"data: ")
        return conn

    def post(self, model: str = "demo") -> httpx.Response:
        """A completion on a new connection (the kernel spreads those over the processes)."""
        with httpx.Client(timeout=10) as client:
            return client.post(self.url + "/v1/completions", headers={"x-api-key": KEY},
                               json={"model": model, "prompt": "hi", "max_tokens": 2})

    def until_at_rest(self) -> None:
        """Until no request is in flight in any process (bounded)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = httpx.get(self.url + "/metrics", timeout=10).text
            if sum(float(v) for v in re.findall(
                    r"^gateway_requests_in_flight\{[^}]*\} (\S+)$", text, re.M)) == 0:
                return
            time.sleep(0.05)
        raise AssertionError("requests still in flight")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("processes")
    sim, sim_url = procs.simulator(tmp, "--ttft-ms", "0", "--itl-ms", "0")
    try:
        proc, url = procs.gateway(tmp, f"""
server: {{workers: 2, api_keys: [{KEY}], max_concurrent_requests: {LIMIT}, failover_attempts: 1}}
default_model: demo
models:
  - {{name: demo, backend: vllm, aliases: [demo-alias], routing: least_request}}
  - {{name: static, backend: vllm, upstreams: [{sim_url}], aliases: [st], routing: round_robin}}
workers: [{{kind: simulator, model: demo, args: [--ttft-ms, "0", --itl-ms, "0"]}}]
""")
    except BaseException:
        sim.stop()
        raise
    try:
        yield Gateway(proc, url)
    finally:
        proc.stop()
        sim.stop()


def test_the_concurrency_limit_is_the_whole_gateways(gw: Gateway) -> None:
    """`max_concurrent_requests` (SPEC.md: beyond it, 429 with Retry-After) holds for the
    gateway, not each serving process: with LIMIT streams open, a request on any connection,
    whichever process takes it, is refused. TGI, whose setting this is, counts one semaphore
    for its whole server (text-generation-inference router/src/infer/mod.rs,
    `limit_concurrent_requests`). Before, each process counted its own: the gateway took up
    to twice the limit, and a request's refusal depended on the process it reached."""
    holds = [gw.hold() for _ in range(LIMIT)]
    try:
        for _ in range(10):
            refused = gw.post()
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    finally:
        for conn in holds:
            conn.close()
    gw.until_at_rest()
    assert gw.post().status_code == 200


def test_a_killed_serving_process_is_restarted_with_its_places_and_counts(gw: Gateway) -> None:
    """SIGKILL to a serving process: the parent starts another on its socket (connections
    that queued there meanwhile are served), the requests it had admitted no longer count
    against the limit, and what it had counted stays in /metrics (prometheus_client's
    multiprocess files outlive their process)."""
    for _ in range(4):
        assert gw.post().status_code == 200
    served = served_total(httpx.get(gw.url + "/metrics", timeout=10).text)
    before = gw.serving()
    holds = [gw.hold() for _ in range(LIMIT)]
    try:
        victim = procs.holder(gw.port, holds[0].sock.getsockname()[1], before)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while (len(now := gw.serving()) < 2 or victim in now) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(now) == 2 and victim not in now
    finally:
        for conn in holds:
            conn.close()
    gw.until_at_rest()
    statuses, _ = health_and_gauges(gw.url, 6)
    assert statuses == {200}
    holds = [gw.hold() for _ in range(LIMIT)]  # every place free again
    for conn in holds:
        conn.close()
    gw.until_at_rest()
    after = served_total(httpx.get(gw.url + "/metrics", timeout=10).text)
    assert after >= served
    for _ in range(6):
        assert gw.post().status_code == 200
    assert served_total(httpx.get(gw.url + "/metrics", timeout=10).text) == after + 6


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=20)


def _es(url: str) -> Elasticsearch:
    return Elasticsearch(url, api_key=KEY, max_retries=0, request_timeout=20)


def _lmi(body: dict[str, object]) -> Callable[[str], object]:
    def call(url: str) -> object:
        resp = httpx.post(url + "/invocations", json=body, headers={"x-api-key": KEY},
                          timeout=20)
        assert resp.status_code == 200, resp.text
        return resp.json()
    return call


def _tgi(url: str) -> Any:
    import text_generation as tg  # installed by the test command (--no-deps)

    return tg.Client(url, headers={"authorization": f"Bearer {KEY}"}, timeout=20)


def _hf_chat_stream(hf: InferenceClient) -> str:
    """(The client stays referenced while its stream is read: collected, it closes it.)"""
    return "".join(c.choices[0].delta.content or ""
                   for c in hf.chat_completion(MSG, max_tokens=3, stream=True))


def _hf_stream(hf: InferenceClient) -> str:
    return "".join(hf.text_generation("x", max_new_tokens=3, stream=True))


SSE = {"accept": "text/event-stream", "content-type": "application/json"}
CLIENTS: dict[str, Callable[[str], object]] = {
    "openai-chat-alias": lambda u: _openai(u).chat.completions.create(
        model="demo-alias", messages=MSG, max_tokens=3).choices[0].message.content,
    "openai-chat-stream-static": lambda u: "".join(
        c.choices[0].delta.content or "" for c in _openai(u).chat.completions.create(
            model="static", messages=MSG, max_tokens=3, stream=True) if c.choices),
    "openai-completions-static-alias": lambda u: _openai(u).completions.create(
        model="st", prompt="x", max_tokens=3).choices[0].text,
    "openai-completions-stream": lambda u: "".join(
        c.choices[0].text for c in _openai(u).completions.create(
            model="demo", prompt="x", max_tokens=3, stream=True) if c.choices),
    "hf-chat-placeholder": lambda u: InferenceClient(base_url=u, api_key=KEY).chat_completion(
        MSG, model="tgi", max_tokens=3).choices[0].message.content,
    "hf-chat-stream": lambda u: _hf_chat_stream(InferenceClient(base_url=u, api_key=KEY)),
    "hf-text-generation": lambda u: InferenceClient(base_url=u, api_key=KEY).text_generation(
        "x", max_new_tokens=3),
    "hf-text-generation-stream": lambda u: _hf_stream(InferenceClient(base_url=u, api_key=KEY)),
    "text-generation": lambda u: _tgi(u).generate("x", max_new_tokens=3).generated_text,
    "text-generation-stream": lambda u: "".join(
        r.token.text for r in _tgi(u).generate_stream("x", max_new_tokens=3)),
    "elastic-completion": lambda u: _es(u).inference.completion(
        inference_id="static", input="x")["completion"][0]["result"],
    "elastic-chat-stream-alias": lambda u: _es(u).perform_request(
        "POST", "/_inference/chat_completion/demo-alias/_stream", headers=SSE,
        body={"messages": MSG}).body,
    "lmi-inputs": _lmi({"inputs": "x", "parameters": {"max_new_tokens": 3}}),
    "lmi-messages": _lmi({"messages": MSG, "max_tokens": 3}),
    "lmi-prompt": _lmi({"prompt": "x", "max_tokens": 3}),
}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # text-generation's pydantic calls
@pytest.mark.parametrize("client", CLIENTS)
def test_every_client_in_either_process(gw: Gateway, client: str) -> None:
    """Each protocol through its real client, with a key, its model names (aliases, TGI's
    placeholder `tgi`, none) resolved by whichever process each new connection reaches."""
    for _ in range(4):
        assert CLIENTS[client](gw.url)


NO_KEY = [("/v1/chat/completions", {"model": "demo", "messages": MSG}, "error"),
          ("/generate", {"inputs": "x"}, "error_type"),
          ("/invocations", {"inputs": "x"}, "error"),
          ("/_inference/completion/demo", {"input": "x"}, "status")]


def test_no_key_is_refused_by_each_process_in_each_protocol(gw: Gateway) -> None:
    """SPEC.md server.api_keys: without one, 401 in the protocol's own error body."""
    for _ in range(4):
        for path, body, field in NO_KEY:
            resp = httpx.post(gw.url + path, json=body, timeout=10)
            assert resp.status_code == 401 and field in resp.json(), (path, resp.text)


def test_a_managed_worker_killed_is_used_again_by_every_process(gw: Gateway) -> None:
    """The parent restarts its managed worker (SPEC.md: restarted with backoff when it
    dies); every serving process routes to it again: /health 200 and requests served on
    connections that reach either process."""
    sims = [p for p in procs.children_of(gw.proc.pid) if "simulator" in procs.cmdline(p)]
    assert len(sims) == 1
    os.kill(sims[0], signal.SIGKILL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        now = [p for p in procs.children_of(gw.proc.pid) if "simulator" in procs.cmdline(p)
               and procs.alive(p)]
        if now and now != sims and health_and_gauges(gw.url, 6)[0] == {200}:
            break
        time.sleep(0.05)
    assert now and now != sims
    assert [gw.post().status_code for _ in range(8)] == [200] * 8


def test_managed_workers_do_not_get_the_serving_processes_metrics_directory(
        tmp_path: Path) -> None:
    """With several serving processes the parent sets PROMETHEUS_MULTIPROC_DIR to its own
    metrics directory (prometheus_client's multiprocess mode), and the managed workers it
    started inherited it. vLLM takes a set PROMETHEUS_MULTIPROC_DIR as the user's
    (vllm/v1/metrics/prometheus.py `setup_multiprocess_prometheus`: "Found
    PROMETHEUS_MULTIPROC_DIR was set by user") and serves whatever that directory holds on its
    /metrics (`get_prometheus_registry`: a MultiProcessCollector over it): the gateway's
    series in vLLM's /metrics, vLLM's files in the gateway's directory, and vLLM's process
    (a child of the gateway's parent) summed into the gateway's `process_*` metrics. A
    worker gets the environment the gateway was started with."""
    gw, _ = procs.gateway(tmp_path, CONFIG, env={"WORKER_ENV_MARK": "1"})
    try:
        sims = [p for p in procs.children_of(gw.pid) if "simulator" in procs.cmdline(p)]
        assert len(sims) == 1
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{sims[0]}/environ").read_text().split("\0") if "=" in item)
    finally:
        gw.stop()
    assert environ.get("WORKER_ENV_MARK") == "1"  # the gateway's environment, as it was
    assert "PROMETHEUS_MULTIPROC_DIR" not in environ


def test_a_worker_port_held_by_another_server_is_in_no_process_rotation(tmp_path: Path) -> None:
    """`workers[].port` held by another server, with two serving processes: the parent does
    not start the worker there (the port is in use), but each serving process gated the
    worker into its own rotation by probing its URL, which the other server answered:
    /health flipped between 200 and 503 and requests went to that server (404 "model `demo`
    does not exist" from it). A serving process now takes a worker in only while the parent
    runs it."""
    other, other_url = procs.simulator(tmp_path, "--model-name", "other")
    port = int(other_url.rsplit(":", 1)[1])
    gw_port = procs.free_port()
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(f"server: {{workers: 2, drain_seconds: 1}}\ndefault_model: demo\n"
                   f"workers: [{{kind: vllm, model: demo, port: {port}}}]\n")
    gw = procs.Proc([sys.executable, "-m", "gateway", "serve", "--config", str(cfg),
                     "--host", "127.0.0.1", "--port", str(gw_port)], tmp_path / "gw.log")
    url = f"http://127.0.0.1:{gw_port}"
    try:
        deadline = time.monotonic() + 30
        while '"listening"' not in gw.output() and time.monotonic() < deadline:
            assert gw.popen.poll() is None, gw.output()
            time.sleep(0.05)
        while "worker_start_failed" not in gw.output() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # watchers probe every 0.1 s: long enough to have taken it in
        statuses = {httpx.get(url + "/health", timeout=5).status_code for _ in range(12)}
        assert statuses == {503}, statuses
    finally:
        gw.stop()
        other.stop()
