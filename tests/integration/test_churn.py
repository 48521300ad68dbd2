"""Churn: a gateway before faulty workers, a few hundred mixed requests, then back at rest.

Two simulators (model `chat`, one of them killed and restarted during the run) and the TGI fake
(model `tgifake`) behind a gateway with `failover_attempts: 1`; requests in every client
protocol, with the workers' faults in their prompts (tests/integration/churn.py) and clients
that leave at random points. Then, as SPEC.md promises: every answer read to its end is well
formed in its protocol; every request has exactly one log line with its outcome; at rest
nothing is in flight (`gateway_requests_in_flight`), every upstream is healthy again, /health
is 200, and the serving processes' open descriptors are back near where they started.
Random choices come from a seeded generator; what is asserted are invariants, never timings.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import structlog
import yaml

from gateway import app as gateway_app
from gateway import config, http1, http_server, listener, observability, serving
from tests.integration import churn, procs

pytestmark = pytest.mark.integration

SEED = 20250611
RATE = 40  # requests started per second
DRIVE_S = 6.0  # seconds of requests (a gateway process)
IN_PROCESS_S = 4.0  # seconds of requests (the gateway in the test's own loop)
MAX_CONCURRENT = 64
FD_SLACK = 4  # descriptors above the start tolerated at rest (a probe's connection, a log)
REST_S = 12.0  # bounded polling for the rest state (the workers' keep-alive is 5 s)
SIM_ARGS = ("--ttft-ms", "5", "--itl-ms", "15", "--tokens", "6")

CONFIG = """\
server:
  workers: {workers}
  failover_attempts: 1
  drain_seconds: 2
  timeouts: {{connect: 1, first_byte: 1.5, idle: 1, request_read: 2}}
  health: {{backoff: 0.5, backoff_max: 1, probe_interval: 0.5, probe_timeout: 1}}
default_model: chat
models:
  - name: chat
    backend: vllm
    upstreams: [{a}, {b}]
  - name: tgifake
    backend: tgi
    upstreams: [{t}]
"""


class Upstreams:
    """The three workers; `b` is killed and started again on its port during a run."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.a, self.a_url = procs.simulator(tmp, *SIM_ARGS)
        self.b_port = procs.free_port()
        self.b = self._start_b()
        port = procs.free_port()
        self.t = procs.Proc([sys.executable, "-m", "tests.fakes.tgi_fake", str(port)],
                            tmp / "tgi.log")
        self.t_url = f"http://127.0.0.1:{port}"
        self.t.wait_http(self.t_url + "/health")

    @property
    def b_url(self) -> str:
        return f"http://127.0.0.1:{self.b_port}"

    def _start_b(self) -> procs.Proc:
        proc = procs.Proc([sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port",
                           str(self.b_port), *SIM_ARGS], self.tmp / f"sim-b-{time.time()}.log")
        proc.wait_http(self.b_url + "/health")
        return proc

    def kill_b(self) -> None:
        self.b.stop(signal.SIGKILL)

    def restart_b(self) -> None:
        self.b = self._start_b()

    def stop(self) -> None:
        for p in (self.a, self.b, self.t):
            p.stop()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    ups = Upstreams(tmp_path_factory.mktemp("churn-workers"))
    try:
        yield ups
    finally:
        ups.stop()


async def drive(port: int, specs: list[churn.Spec], at: dict[float, Callable[[], None]]
                ) -> list[churn.Result]:
    """Start the requests at RATE per second (at most MAX_CONCURRENT at once); run each of
    `at`'s actions (in a thread) once its second of the run has come."""
    limit = asyncio.Semaphore(MAX_CONCURRENT)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(spec: churn.Spec) -> churn.Result:
        async with limit:
            return await churn.send(port, spec)

    async def actions() -> None:
        for when, act in sorted(at.items()):
            await asyncio.sleep(max(0.0, start + when - loop.time()))
            await asyncio.to_thread(act)

    side = asyncio.create_task(actions())
    tasks = []
    for i, spec in enumerate(specs):
        await asyncio.sleep(max(0.0, start + i / RATE - loop.time()))
        tasks.append(asyncio.create_task(one(spec)))
    results = await asyncio.gather(*tasks)
    await side
    return list(results)


TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
              "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK",
              "0A": "LISTEN", "0B": "CLOSING"}


def counted_fds(pid: int, port: int) -> list[str]:
    """Open descriptors, less the established connections the gateway opened to its workers
    (the upstream pool keeps idle ones for reuse for as long as each worker keeps them): a
    client connection (local `port`), a half-closed one or any other descriptor counts. Each
    is described (a socket by its TCP state and ports), for the failure's message."""
    sockets: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote = (int(a.rsplit(":", 1)[1], 16) for a in (f[1], f[2]))
        state = TCP_STATES.get(f[3], f[3])
        if state == "ESTABLISHED" and local != port:  # outgoing: pooled
            sockets[f"socket:[{f[9]}]"] = ""
        else:
            sockets[f"socket:[{f[9]}]"] = f"tcp {state} {local}->{remote}"
    described = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        what = sockets.get(target, target)
        if what:
            described.append(what)
    return described


def open_fds(pid: int, port: int) -> int:
    return len(counted_fds(pid, port))


def serving_pids(gw: procs.Proc, workers: int) -> list[int]:
    """The serving processes: the parent's spawned children, not multiprocessing's resource
    tracker, which is a child too (counting it once stood for a process not yet spawned)."""
    if workers == 1:
        return [gw.pid]
    deadline = time.monotonic() + 10
    while True:
        pids = [p for p in procs.children_of(gw.pid) if "spawn_main" in procs.cmdline(p)]
        if len(pids) >= workers or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def warm_every_process(gw: procs.Proc, port: int, pids: list[int]) -> None:
    """A few requests of each model, in rounds, until every serving process has answered one
    (its log line names its pid): the descriptors counted at the start must be a started
    process's. A process the parent has just spawned is still importing (8 descriptors
    against 27 once serving, as CI once measured) while the other, already serving, answers
    /health and the first round."""
    deadline = time.monotonic() + 20
    for round_ in itertools.count():
        warm = [churn.Spec(f"warm-{round_}-{i}", "/v1/chat/completions",
                           {"model": m, "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 2}, "openai_json", "full", 0)
                for i, m in enumerate(["chat", "chat", "tgifake", "tgifake"])]
        for r in asyncio.run(drive(port, warm, {})):
            assert churn.judge(r) is None and r.status == 200, (r.status, r.body)
        time.sleep(0.1)  # the log lines of the round
        lines = [json.loads(line) for line in gw.log.read_text().splitlines()
                 if line.startswith("{")]
        served = {obj.get("pid") for obj in lines if obj.get("event") == "request"}
        if len(pids) == 1 or served >= set(pids):
            return
        assert time.monotonic() < deadline, f"processes {pids}; answered from {served}"


def rest_state(url: str, pids: list[int], fds0: dict[int, int]) -> list[str]:
    """What is not yet back at rest (empty: everything is)."""
    port = int(url.rsplit(":", 1)[1])
    wrong = []
    text = httpx.get(url + "/metrics", timeout=5).text
    in_flight = re.findall(r"^gateway_requests_in_flight\{[^}]*\} (\S+)$", text, re.M)
    if not in_flight or any(float(v) for v in in_flight):
        wrong.append(f"gateway_requests_in_flight {in_flight}")
    healthy = re.findall(r"^gateway_upstream_healthy\{[^}]*\} (\S+)$", text, re.M)
    if len(healthy) != 3 or any(float(v) != 1 for v in healthy):
        wrong.append(f"gateway_upstream_healthy {healthy}")
    if (status := httpx.get(url + "/health", timeout=5).status_code) != 200:
        wrong.append(f"/health {status}")
    for pid in pids:
        if (n := open_fds(pid, port)) > fds0[pid] + FD_SLACK:
            kinds = Counter(counted_fds(pid, port)).most_common()
            wrong.append(f"pid {pid}: {n} open descriptors, {fds0[pid]} at the start: {kinds}")
    return wrong


def request_lines(log: str) -> Counter[str]:
    """How many `request` log lines each request id has (every line must be JSON)."""
    seen: Counter[str] = Counter()
    for line in log.splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)
        if obj.get("event") == "request":
            assert obj.get("outcome"), f"a request line without its outcome: {line}"
            seen[obj["request_id"]] += 1
    return seen


@pytest.mark.parametrize("processes", [1, 2])
def test_after_churn_every_answer_is_whole_and_the_gateway_is_at_rest(
        tmp_path: Path, workers: Upstreams, processes: int) -> None:
    rng = random.Random(SEED + processes)
    gw, url = procs.gateway(tmp_path, CONFIG.format(
        workers=processes, a=workers.a_url, b=workers.b_url, t=workers.t_url))
    port = int(url.rsplit(":", 1)[1])
    try:
        pids = serving_pids(gw, processes)
        warm_every_process(gw, port, pids)
        time.sleep(0.2)
        fds0 = {pid: open_fds(pid, port) for pid in pids}
        specs = [churn.make(rng, i, f"c{processes}", "tgifake")
                 for i in range(int(DRIVE_S * RATE))]
        results = asyncio.run(drive(port, specs, {DRIVE_S * 0.3: workers.kill_b,
                                                  DRIVE_S * 0.6: workers.restart_b}))
        bad = [f"{r.spec.rid} {r.spec.path} {r.spec.body}: {why}"
               for r in results if (why := churn.judge(r)) is not None]
        assert not bad, f"{len(bad)} malformed answers:\n" + "\n".join(bad[:20])
        statuses = Counter(r.status for r in results if r.complete)
        assert statuses[200] > len(specs) // 3, statuses  # the run did serve, too
        deadline = time.monotonic() + REST_S
        while (wrong := rest_state(url, pids, fds0)) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert not wrong, f"not at rest after {REST_S}s: {wrong}"
    finally:
        gw.stop()
    lines = request_lines(gw.log.read_text())
    missing = [s.rid for s in specs if lines[s.rid] == 0]
    twice = {rid: n for rid, n in lines.items() if n > 1}
    assert not missing, f"{len(missing)} requests without a log line: {missing[:10]}"
    assert not twice, f"requests logged more than once: {twice}"


def bookkeeping(services: serving.Services, server: listener.Server, client: http1.Http1Client,
                tasks0: int) -> list[str]:
    """What the gateway's own counters hold that is not at rest (empty: all at rest)."""
    wrong = []
    if services.admission.count:
        wrong.append(f"admitted requests in flight: {services.admission.count}")
    for route in services.router.routes.values():
        for url, h in route.upstreams.health.items():
            if h.in_flight or h.trial:
                wrong.append(f"{route.name} {url}: in_flight {h.in_flight}, trial {h.trial}")
    if server.connections:
        wrong.append(f"{len(server.connections)} client connections still open")
    for origin, idle in client.idle.items():
        if len(idle) > MAX_CONCURRENT:
            wrong.append(f"{origin}: {len(idle)} pooled connections")
        if dead := [c for c in idle if not c.reusable()]:
            wrong.append(f"{origin}: {len(dead)} closed connections kept in the pool")
    if (n := len(asyncio.all_tasks())) > tasks0:
        wrong.append(f"{n} tasks, {tasks0} at the start")
    return wrong


@pytest.mark.anyio
async def test_in_process_the_balancer_pools_and_tasks_return_to_rest(
        workers: Upstreams, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same churn against the gateway in this process, where its balancer's per-upstream
    in-flight counts, its upstream connection pool and the event loop's tasks can be read."""
    cfg = config.Config.model_validate(yaml.safe_load(CONFIG.format(
        workers=1, a=workers.a_url, b=workers.b_url, t=workers.t_url)))
    # Each request's one line, read where it is written (structlog, captured below), not by
    # replacing `observability.log_exchange`, which the compiled build (setup.py) calls directly.
    monkeypatch.setattr(observability, "_lines", None)  # not the CLI's batched writer
    app = gateway_app.build_app(cfg)
    services: serving.Services = app.state.services
    server = listener.Server(app, cfg.server)
    loop = asyncio.get_running_loop()
    rng = random.Random(SEED)
    with structlog.testing.capture_logs() as lines:
        async with app.lifespan():
            client = services.pipeline.client
            assert isinstance(client, http1.Http1Client)
            srv = await loop.create_server(lambda: http_server.Connection(server), "127.0.0.1", 0)
            port = srv.sockets[0].getsockname()[1]
            try:
                while not all(r.upstreams.in_rotation() for r in services.router.routes.values()):
                    await asyncio.sleep(0.05)  # the first probes
                tasks0 = len(asyncio.all_tasks())
                specs = [churn.make(rng, i, "inproc", "tgifake")
                         for i in range(int(IN_PROCESS_S * RATE))]
                results = await drive(port, specs, {IN_PROCESS_S * 0.3: workers.kill_b,
                                                     IN_PROCESS_S * 0.6: workers.restart_b})
                bad = [f"{r.spec.rid} {r.spec.path}: {why}"
                       for r in results if (why := churn.judge(r)) is not None]
                assert not bad, f"{len(bad)} malformed answers:\n" + "\n".join(bad[:20])
                end = loop.time() + REST_S
                while (wrong := bookkeeping(services, server, client, tasks0)) and loop.time() < end:
                    await asyncio.sleep(0.1)
                assert not wrong, f"not at rest after {REST_S}s: {wrong}"
            finally:
                srv.close()
                for conn in list(server.connections):
                    conn.close()
    logged = Counter(e["request_id"] for e in lines if e["event"] == "request")
    assert not [s.rid for s in specs if logged[s.rid] != 1], \
        {s.rid: logged[s.rid] for s in specs if logged[s.rid] != 1}
