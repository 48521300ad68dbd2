"""A managed worker's restart backoff doubles while it crashes in a row and starts again
from its base after a run that stayed healthy for `RESTART_RESET_SECONDS` (as the kubelet
resets CrashLoopBackOff after a pod ran long enough)."""

from __future__ import annotations

import asyncio
import sys

import pytest
import structlog

from gateway import config, routing, supervisor


class Healthy:
    """An upstream client whose probes always pass."""

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        return 200, ""


async def restart_delays(monkeypatch: pytest.MonkeyPatch, reset: float) -> list[float]:
    """The waits before the first four restarts of a worker that serves 0.2 s, then exits 1."""
    monkeypatch.setattr(supervisor, "RESTART_BASE_SECONDS", 0.01)
    monkeypatch.setattr(supervisor, "RESTART_RESET_SECONDS", reset)
    cfg = config.Config.model_validate({"models": [{"name": "demo"}],
                                        "workers": [{"kind": "simulator", "model": "demo"}]})
    sup = supervisor.Supervisor(cfg, routing.Router(cfg), Healthy())  # type: ignore[arg-type]
    worker = sup.workers[0]
    monkeypatch.setattr(worker, "command", lambda: [
        sys.executable, "-c", "import time; time.sleep(0.2); raise SystemExit(1)"])
    with structlog.testing.capture_logs() as logs:
        task = asyncio.ensure_future(worker.run())
        try:
            async with asyncio.timeout(20):  # bounded: four runs of 0.2 s and their waits
                while len([e for e in logs if e["event"] == "worker_exited"]) < 4:
                    await asyncio.sleep(0.02)
        finally:
            await worker.stop(1.0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return [e["restart_in_s"] for e in logs if e["event"] == "worker_exited"][:4]


@pytest.mark.anyio
async def test_crashes_in_a_row_double_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    assert await restart_delays(monkeypatch, reset=60.0) == [0.01, 0.02, 0.04, 0.08]


@pytest.mark.anyio
async def test_a_run_healthy_for_the_stable_window_resets_the_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert await restart_delays(monkeypatch, reset=0.1) == [0.01, 0.01, 0.01, 0.01]


def test_a_workers_credential_flags_are_masked_in_its_start_line() -> None:
    """`worker_started` logs the command line; vLLM takes its server's key as `--api-key` and
    a hub token as `--hf-token` (vllm/entrypoints/openai/cli_args.py, engine/arg_utils.py):
    their values never reach the log, while paths and counts stay readable."""
    argv = ["vllm", "serve", "org/m", "--api-key", "sk-1", "--hf-token=hf_x", "--port", "8001",
            "--tokenizer", "org/tok", "--ssl-keyfile", "k.pem", "--max-num-seqs", "4"]
    assert supervisor.shown(argv) == [
        "vllm", "serve", "org/m", "--api-key", "***", "--hf-token=***", "--port", "8001",
        "--tokenizer", "org/tok", "--ssl-keyfile", "k.pem", "--max-num-seqs", "4"]


@pytest.mark.anyio
async def test_a_managed_worker_ejected_once_is_restored_by_its_probe_without_traffic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A managed worker (the sidecar topology's one upstream) ejected by failing requests:
    once the backoff is over, its supervisor's passing probe restores it, as the active probe
    does a static upstream (SPEC.md: ejected, then tried again half-open). Without it, with no
    request to try it (a pod out of its Service gets none), `gateway_upstream_healthy` (what
    `in_service` counts) said 0 for a worker that /health counted and that was serving fine."""
    monkeypatch.setattr(supervisor, "HEALTH_PERIOD_SECONDS", 0.02)
    cfg = config.Config.model_validate({
        "server": {"health": {"eject_after": 1, "backoff": 0.05}},
        "models": [{"name": "demo"}], "workers": [{"kind": "simulator", "model": "demo"}]})
    sup = supervisor.Supervisor(cfg, routing.Router(cfg), Healthy())  # type: ignore[arg-type]
    worker = sup.workers[0]
    ups = worker.route.upstreams
    task = asyncio.ensure_future(worker.watch())
    try:
        async with asyncio.timeout(5):
            await worker.healthy.wait()
            assert ups.failed(worker.url, ups.begin(worker.url)) is True
            ups.end(worker.url)
            assert ups.in_service() == []
            while ups.in_service() != [worker.url]:
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
