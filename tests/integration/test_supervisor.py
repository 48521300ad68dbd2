"""Managed workers: the real command lines, health gating, crash and restart with backoff,
output in the structured log, and shutdown with no process left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest
import structlog

from gateway import config, routing, supervisor, upstream
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
    sup = supervisor.Supervisor(cfg, router, upstream.HttpxClient.__new__(upstream.HttpxClient))
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
    client = upstream.AiohttpClient(2.0)
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
    client = upstream.AiohttpClient(2.0)
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
    import time

    proc, _ = procs.gateway(tmp_path, None)
    workers = procs.children_of(proc.pid)
    assert workers
    proc.stop(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(procs.alive(p) for p in workers):
        time.sleep(0.05)
    assert not any(procs.alive(p) for p in workers), "a worker outlived its killed gateway"
