"""Managed workers: the real command lines, health gating, crash and restart with backoff,
output in the structured log, and shutdown with no process left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time

import pytest
import structlog

from gateway import config, routing, supervisor, upstream_clients
from tests.integration import procs

pytestmark = pytest.mark.integration


def make(workers: list[dict[str, object]], models: list[dict[str, object]] | None = None
         ) -> tuple[config.Config, routing.Router]:
    cfg = config.Config.model_validate({
        "models": models or [{"name": "demo", "upstream_model": "org/demo"}],
        "workers": workers})
    return cfg, routing.Router(cfg)


def test_real_command_lines_from_a_config() -> None:
    cfg, router = make(
        [{"kind": "vllm", "model": "llama", "port": 8001,
          "args": ["--tensor-parallel-size", "2"], "gpus": "0,1", "env": {"HF_HOME": "/m"}},
         {"kind": "trtllm", "model": "llama", "port": 8002, "args": ["--backend", "pytorch"]},
         {"kind": "simulator", "model": "llama", "port": 8003, "args": ["--tokens", "4"]}],
        [{"name": "llama", "upstream_model": "meta-llama/Llama-3.1-8B-Instruct"}])
    sup = supervisor.Supervisor(cfg, router, upstream_clients.HttpxClient.__new__(upstream_clients.HttpxClient))
    vllm, trt, sim = sup.workers
    assert vllm.command() == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--host",
                              "127.0.0.1", "--port", "8001", "--tensor-parallel-size", "2"]
    assert trt.command() == ["trtllm-serve", "meta-llama/Llama-3.1-8B-Instruct", "--host",
                             "127.0.0.1", "--port", "8002", "--backend", "pytorch"]
    assert sim.command() == [sys.executable, "-m", "simulator", "--host", "127.0.0.1",
                             "--port", "8003", "--model-name",
                             "meta-llama/Llama-3.1-8B-Instruct", "--tokens", "4"]
    env = vllm.environment()
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["HF_HOME"] == "/m"
    assert "CUDA_VISIBLE_DEVICES" not in trt.environment() or \
        trt.environment()["CUDA_VISIBLE_DEVICES"] == os.environ.get("CUDA_VISIBLE_DEVICES")


async def _until(check: object, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.mark.anyio
async def test_health_gating_crash_restart_and_clean_shutdown(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    monkeypatch.setattr(supervisor, "RESTART_BASE_SECONDS", 0.2)
    cfg, router = make([{"kind": "simulator", "model": "demo", "args": ["--ttft-ms", "0"]}])
    client = upstream_clients.AiohttpClient(2.0)
    sup = supervisor.Supervisor(cfg, router, client)
    worker = sup.workers[0]
    ups = router.routes["demo"].upstreams
    with structlog.testing.capture_logs() as logs:
        try:
            assert ups.all == []  # nothing is served before the worker is healthy
            await sup.start(wait_for_fast=20)
            assert ups.all == [worker.url]
            first = worker.proc
            assert first is not None
            os.kill(first.pid, signal.SIGKILL)  # the worker crashes
            await _until(lambda: worker.url not in ups.all, 5)
            await _until(lambda: worker.restarts == 1 and worker.healthy.is_set(), 20)
            assert worker.proc is not None and worker.proc.pid != first.pid
            assert ups.all == [worker.url]
            pids = [worker.proc.pid]
        finally:
            await sup.stop(grace=5)
            await client.aclose()
    assert ups.all == []
    assert all(not procs.alive(p) for p in pids)
    events = [e["event"] for e in logs]
    assert events.count("worker_started") == 2 and events.count("worker_healthy") == 2
    exited = next(e for e in logs if e["event"] == "worker_exited")
    assert exited["code"] == -signal.SIGKILL and exited["restart_in_s"] >= 0.2


@pytest.mark.anyio
async def test_worker_output_goes_to_the_log_and_never_policy_stops() -> None:
    cfg, router = make([{"kind": "simulator", "model": "demo", "restart": "never",
                         "args": ["--no-such-flag"]}])
    client = upstream_clients.AiohttpClient(2.0)
    sup = supervisor.Supervisor(cfg, router, client)
    with structlog.testing.capture_logs() as logs:
        try:
            await asyncio.wait_for(sup.workers[0].run(), 20)
        finally:
            await sup.stop(grace=2)
            await client.aclose()
    lines = [e["line"] for e in logs if e["event"] == "worker_output"]
    assert any("--no-such-flag" in line for line in lines), lines
    assert sup.workers[0].restarts == 0


def test_no_worker_survives_a_gateway_killed_with_sigkill(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """PR_SET_PDEATHSIG: the kernel kills the worker when its gateway dies, however it dies."""
    proc, _ = procs.gateway(tmp_path, None)
    workers = procs.children_of(proc.pid)
    assert workers
    proc.stop(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(procs.alive(p) for p in workers):
        time.sleep(0.05)
    assert not any(procs.alive(p) for p in workers), "a worker outlived its killed gateway"


class Probes:
    """An upstream client whose health probes answer what the test sets."""

    def __init__(self, status: int = 200):
        self.status = status

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        return self.status, ""


async def run_until_restarted(worker: supervisor.ManagedWorker, restarts: int,
                              pause: float) -> None:
    """Run `worker` until it has been restarted `restarts` times (20 s at most), then stop it."""
    task = asyncio.ensure_future(worker.run())
    try:
        async with asyncio.timeout(20):
            while worker.restarts < restarts:
                await asyncio.sleep(pause)
    finally:
        await worker.stop(grace=1.0)
        await asyncio.wait_for(task, 5)


def scripted(monkeypatch: pytest.MonkeyPatch, script: str, client: Probes, **entry: object
             ) -> supervisor.ManagedWorker:
    """A managed worker whose process runs `script` (python -c)."""
    cfg, router = make([{"kind": "simulator", "model": "demo", **entry}])
    worker = supervisor.Supervisor(cfg, router, client).workers[0]  # type: ignore[arg-type]
    monkeypatch.setattr(worker, "command", lambda: [sys.executable, "-c", script])
    return worker


@pytest.mark.anyio
async def test_a_worker_line_over_the_pipe_limit_does_not_stop_its_output(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that prints a line longer than the output reader's 64 KiB limit (a config dump
    on one line): the lines after it still reach the log. The pump used to end on it, leaving
    the pipe unread (a worker blocks once its pipe is full) and its ValueError to asyncio's
    "Task exception was never retrieved"."""
    worker = scripted(monkeypatch, "import sys, time\n"
                                   "print('x' * 200000, flush=True)\n"
                                   "print('y' * 100000 + '\\n' + 'x' * 100000, flush=True)\n"
                                   "for i in range(2000):\n"
                                   "    print('after', i, 'z' * 100, flush=True)\n"
                                   "time.sleep(60)\n", Probes(200))
    with structlog.testing.capture_logs() as logs:
        task = asyncio.ensure_future(worker.run())
        try:
            async with asyncio.timeout(20):
                while not any(e.get("line", "").startswith("after 1999 ") for e in logs):
                    await asyncio.sleep(0.02)
        finally:
            await worker.stop(grace=1.0)
            await asyncio.wait_for(task, 5)
    lines = [e["line"] for e in logs if e["event"] == "worker_output"]
    assert [line for line in lines if line.startswith("after")] == [
        f"after {i} {'z' * 100}" for i in range(2000)]


# Prints its own pid and that of a child in its process group, then sleeps.
_FAMILY = ("import os, signal, subprocess, sys, time\n"
           "{setup}\n"
           "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
           "print(os.getpid(), child.pid, flush=True)\n"
           "time.sleep(60)\n")


@pytest.mark.anyio
@pytest.mark.parametrize(("setup", "code"), [
    ("", -signal.SIGTERM),
    ("signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))", 0),
    ("signal.signal(signal.SIGTERM, signal.SIG_IGN)", -signal.SIGKILL),
], ids=["dies-on-sigterm", "exits-on-sigterm", "ignores-sigterm"])
async def test_stop_sends_sigterm_then_sigkill_to_the_whole_group(
        monkeypatch: pytest.MonkeyPatch, setup: str, code: int) -> None:
    """SPEC.md (Workers the gateway manages): stopped by SIGTERM, then SIGKILL; a worker that
    ignores SIGTERM is killed once the grace is over, and a process it started goes too."""
    worker = scripted(monkeypatch, _FAMILY.format(setup=setup), Probes(200))
    with structlog.testing.capture_logs() as logs:
        task = asyncio.ensure_future(worker.run())
        try:
            async with asyncio.timeout(20):
                while not any(e["event"] == "worker_output" for e in logs):
                    await asyncio.sleep(0.02)
            pids = [int(p) for p in next(e["line"] for e in logs
                                         if e["event"] == "worker_output").split()]
            started = asyncio.get_running_loop().time()
            await worker.stop(grace=1.0)
            took = asyncio.get_running_loop().time() - started
        finally:
            await worker.stop(grace=1.0)
            await asyncio.wait_for(task, 5)
    assert worker.proc is not None and worker.proc.returncode == code
    assert took < 5 and (took >= 1.0) == (code == -signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(procs.alive(p) for p in pids):
        await asyncio.sleep(0.05)
    assert not any(procs.alive(p) for p in pids)
    assert worker.restarts == 0  # a stopped worker is not restarted


@pytest.mark.anyio
async def test_a_worker_never_healthy_within_startup_timeout_is_killed_and_restarted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose health route never answers 200 is never put in rotation; past its
    `startup_timeout` it is killed and started again, with backoff."""
    monkeypatch.setattr(supervisor, "RESTART_BASE_SECONDS", 0.05)
    worker = scripted(monkeypatch, "import time; time.sleep(60)", Probes(503),
                      startup_timeout=0.5)
    with structlog.testing.capture_logs() as logs:
        await run_until_restarted(worker, 2, 0.02)
    assert worker.route.upstreams.all == []
    events = [e["event"] for e in logs]
    assert "worker_healthy" not in events and events.count("worker_unhealthy") >= 2
    exits = [e for e in logs if e["event"] == "worker_exited"]
    assert [e["code"] for e in exits[:2]] == [-signal.SIGKILL] * 2
    assert exits[0]["restart_in_s"] < exits[1]["restart_in_s"]


@pytest.mark.anyio
async def test_a_running_worker_failing_its_probes_leaves_rotation_and_comes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Health is probed while the worker runs: HEALTH_FAILURES failed probes in a row take
    it out of its model's upstreams (the process is left running: `unhealthy_timeout` 0
    never stops it), a passing one puts it back."""
    monkeypatch.setattr(supervisor, "HEALTH_PERIOD_SECONDS", 0.05)
    client = Probes(200)
    worker = scripted(monkeypatch, "import time; time.sleep(60)", client, unhealthy_timeout=0)
    ups = worker.route.upstreams
    task = asyncio.ensure_future(worker.run())
    try:
        await _until(lambda: ups.all == [worker.url], 20)
        client.status = 503
        await _until(lambda: ups.all == [], 5)
        await asyncio.sleep(0.5)  # ten failed probes more
        assert worker.proc is not None and worker.proc.returncode is None
        client.status = 200
        await _until(lambda: ups.all == [worker.url], 5)
        assert worker.restarts == 0
    finally:
        await worker.stop(grace=1.0)
        await asyncio.wait_for(task, 5)


@pytest.mark.anyio
async def test_a_worker_out_of_rotation_past_unhealthy_timeout_is_restarted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose process runs but whose probes keep failing (a hung engine) is out of
    rotation at once, and past `unhealthy_timeout` stopped (SIGTERM, then SIGKILL: this one
    ignores SIGTERM) and started again; back in rotation once its probe passes."""
    monkeypatch.setattr(supervisor, "HEALTH_PERIOD_SECONDS", 0.05)
    monkeypatch.setattr(supervisor, "LEFTOVER_GRACE_SECONDS", 0.3)
    monkeypatch.setattr(supervisor, "RESTART_BASE_SECONDS", 0.05)
    client = Probes(200)
    hung = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    worker = scripted(monkeypatch, hung, client, unhealthy_timeout=0.5)
    ups = worker.route.upstreams
    with structlog.testing.capture_logs() as logs:
        task = asyncio.ensure_future(worker.run())
        try:
            await _until(lambda: ups.all == [worker.url], 20)
            first = worker.proc
            assert first is not None
            client.status = 503
            await _until(lambda: ups.all == [], 5)
            left = asyncio.get_running_loop().time()
            await _until(lambda: worker.restarts == 1, 10)
            assert asyncio.get_running_loop().time() - left >= 0.5 + 0.3
            assert first.returncode == -signal.SIGKILL
            client.status = 200
            await _until(lambda: ups.all == [worker.url], 20)
            assert worker.proc is not None and worker.proc.pid != first.pid
        finally:
            await worker.stop(grace=1.0)
            await asyncio.wait_for(task, 5)
    events = [e["event"] for e in logs]
    assert events.count("worker_unhealthy_too_long") == 1
    assert events.index("worker_unhealthy") < events.index("worker_unhealthy_too_long")


@pytest.mark.anyio
async def test_a_worker_whose_command_cannot_run_is_logged_and_tried_again_with_backoff(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A `vllm` worker on a host without vLLM: the gateway serves on and said nothing (the
    exec error ended the worker's task unseen). Now each failed start is an error line naming
    the command and the cause, and is tried again with the restart backoff."""
    monkeypatch.setattr(supervisor, "RESTART_BASE_SECONDS", 0.01)
    cfg, router = make([{"kind": "vllm", "model": "demo"}])
    worker = supervisor.Supervisor(cfg, router, Probes(200)).workers[0]  # type: ignore[arg-type]
    monkeypatch.setattr(worker, "command", lambda: ["/nonexistent/vllm", "serve", "org/demo"])
    with structlog.testing.capture_logs() as logs:
        await run_until_restarted(worker, 3, 0.01)
    failed = [e for e in logs if e["event"] == "worker_start_failed"]
    assert failed and failed[0]["log_level"] == "error"
    assert failed[0]["command"][0] == "/nonexistent/vllm" and "FileNotFoundError" in failed[0]["error"]
    exits = [e for e in logs if e["event"] == "worker_exited"][:3]
    assert [e["code"] for e in exits] == [supervisor.NOT_STARTED] * 3
    assert [e["restart_in_s"] for e in exits] == [0.01, 0.02, 0.04]
    assert router.routes["demo"].upstreams.all == []


@pytest.mark.anyio
async def test_a_fast_worker_never_healthy_fails_startup_naming_it() -> None:
    """`gateway serve` with a simulator worker that cannot start exited 1 with
    `serve_failed` and `"error": ""` (a bare TimeoutError): now the line names the worker."""
    cfg, router = make([{"kind": "simulator", "model": "demo", "args": ["--no-such-flag"]}])
    sup = supervisor.Supervisor(cfg, router, Probes(503))  # type: ignore[arg-type]
    try:
        with pytest.raises(TimeoutError) as err:
            await sup.start(wait_for_fast=0.5)
    finally:
        await sup.stop(grace=1.0)
    assert str(err.value).startswith("managed worker not healthy within 0.5s: simulator for "
                                     f"model `demo` at {sup.workers[0].url}")


# Starts a child in its process group that outlives it: it ignores SIGTERM (as a process
# busy releasing a GPU may, or one that installed its own handler); prints both pids. The
# child's output is not the worker's pipe, so that the worker's exit is seen at once under
# either event loop (plain asyncio's Process.wait also waits for the pipe's writers).
_STRAGGLER = ("import os, signal, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
              "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
              "time.sleep(60)'], stdout=subprocess.PIPE, "
              "stderr=subprocess.DEVNULL)\n"
              "child.stdout.readline()\n"
              "print(os.getpid(), child.pid, flush=True)\n"
              "{end}\n")


async def _family(logs: list[dict[str, object]], count: int = 1) -> list[list[int]]:
    """The pids the `_STRAGGLER` runs printed, once `count` runs have printed them."""
    async with asyncio.timeout(20):
        while True:
            lines = [str(e["line"]) for e in logs if e["event"] == "worker_output"]
            if len(lines) >= count:
                return [[int(p) for p in line.split()] for line in lines]
            await asyncio.sleep(0.02)


async def _gone(pids: list[int], timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(procs.alive(p) for p in pids):
        await asyncio.sleep(0.05)
    return not any(procs.alive(p) for p in pids)


@pytest.mark.anyio
async def test_a_process_the_worker_started_is_stopped_even_when_the_worker_exits_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC.md (Workers the gateway manages): stopped by SIGTERM, then SIGKILL. The worker
    exits on SIGTERM at once but a process it started ignores it (vLLM's engine processes
    are its children): stop() returned as soon as the worker itself had exited, and that
    process lived on, orphaned, after the gateway (seen with `gateway serve` and a `vllm`
    that starts a child: the child was left with parent 1). The whole group gets the
    grace, then SIGKILL."""
    worker = scripted(monkeypatch, _STRAGGLER.format(end="time.sleep(60)"), Probes(200))
    with structlog.testing.capture_logs() as logs:
        task = asyncio.ensure_future(worker.run())
        try:
            [pids] = await _family(logs)
            started = asyncio.get_running_loop().time()
            await worker.stop(grace=1.0)
            took = asyncio.get_running_loop().time() - started
        finally:
            await worker.stop(grace=1.0)
            await asyncio.wait_for(task, 5)
    assert worker.proc is not None and worker.proc.returncode == -signal.SIGTERM
    assert await _gone(pids), "a process of the stopped worker lives on"
    assert 1.0 <= took < 5


@pytest.mark.anyio
async def test_a_crashed_workers_leftover_processes_end_before_it_restarts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dies (a crash, the kernel's OOM killer) leaves the processes it started
    behind, holding its port and GPU memory: the next start would fail on them, and each
    restart left more. What is left of its process group is stopped (SIGTERM, then
    SIGKILL) before the restart."""
    monkeypatch.setattr(supervisor, "RESTART_BASE_SECONDS", 0.05)
    monkeypatch.setattr(supervisor, "LEFTOVER_GRACE_SECONDS", 0.5)
    worker = scripted(monkeypatch, _STRAGGLER.format(end="sys.exit(3)"), Probes(503))
    with structlog.testing.capture_logs() as logs:
        task = asyncio.ensure_future(worker.run())
        try:
            runs = await _family(logs, 2)
            first_child = runs[0][1]
            assert await _gone([first_child]), "the crashed worker's child lives on"
        finally:
            await worker.stop(grace=1.0)
            await asyncio.wait_for(task, 5)
    runs = [[int(p) for p in str(e["line"]).split()] for e in logs
            if e["event"] == "worker_output"]
    assert await _gone([p for run in runs for p in run])
    exits = [e for e in logs if e["event"] == "worker_exited"]
    assert exits and exits[0]["code"] == 3


@pytest.mark.anyio
async def test_a_worker_port_where_another_server_listens_is_never_taken_for_the_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`workers[].port` already held by another server (a second gateway's worker, a vLLM
    started by hand): the worker fails to bind and exits, but its health probe reached the
    other server, so the gateway put that server in rotation as its worker within 0.1 s and
    sent it the model's requests (seen with `gateway serve`: `worker_healthy` before the
    simulator's own "address already in use", then 404 "model `demo` does not exist" from
    the other server). Now the port is checked first: an error line naming it, no start,
    nothing in rotation, tried again with the restart backoff until the port is free."""
    monkeypatch.setattr(supervisor, "RESTART_BASE_SECONDS", 0.02)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    worker = scripted(monkeypatch, "import time; time.sleep(60)", Probes(200), port=port)
    ups = worker.route.upstreams
    with structlog.testing.capture_logs() as logs:
        task = asyncio.ensure_future(worker.run())
        try:
            await _until(lambda: worker.restarts >= 2, 10)
            assert ups.all == [] and worker.proc is None
            holder.close()
            await _until(lambda: ups.all == [worker.url], 10)
        finally:
            holder.close()
            await worker.stop(grace=1.0)
            await asyncio.wait_for(task, 5)
    failed = [e for e in logs if e["event"] == "worker_start_failed"]
    assert failed and failed[0]["log_level"] == "error"
    assert f"port {port}" in failed[0]["error"] and "in use" in failed[0]["error"]
    assert [e["event"] for e in logs].count("worker_started") == 1
