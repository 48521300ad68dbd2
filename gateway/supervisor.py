"""Managed worker processes: start, gate on health, register as upstream, restart, stop.

Each worker runs as a child in its own process group with PR_SET_PDEATHSIG, so neither it nor
its children outlive a gateway that is killed. Its output goes to the structured log.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import time

from gateway import config, observability, routing, upstream

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ManagedWorker:
    """One configured worker process and its life cycle."""

    def __init__(self, cfg: config.WorkerConfig, route: routing.Route,
                 client: upstream.UpstreamClient):
        self.cfg = cfg
        self.route = route
        self.client = client
        self.port = cfg.port or free_port(cfg.host)
        self.url = f"http://{cfg.host}:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None
        self.healthy = asyncio.Event()
        self.restarts = 0
        self._stopping = False
        self._log = observability.logger().bind(worker=cfg.kind, model=cfg.model, port=self.port)

    def command(self) -> list[str]:
        """The real command line of this kind of worker."""
        host, port = self.cfg.host, str(self.port)
        if self.cfg.kind == "simulator":
            return [sys.executable, "-m", "gateway.simulator", "--host", host, "--port", port,
                    "--model-name", self.route.upstream_model, *self.cfg.args]
        if self.cfg.kind == "vllm":
            return ["vllm", "serve", self.route.upstream_model, "--host", host, "--port", port,
                    *self.cfg.args]
        return ["trtllm-serve", self.route.upstream_model, "--host", host, "--port", port,
                *self.cfg.args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.cfg.env)
        if self.cfg.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cfg.gpus
        return env

    async def run(self) -> None:
        """Start, and restart with exponential backoff while the policy says so."""
        failures = 0
        while not self._stopping:
            started = time.monotonic()
            code = await self._run_once()
            if self._stopping or self.cfg.restart == "never" or (
                    self.cfg.restart == "on-failure" and code == 0):
                return
            failures = 0 if time.monotonic() - started > 60 else failures + 1
            delay = min(30.0, 0.5 * 2 ** failures)
            self.restarts += 1
            self._log.warning("worker_exited", code=code, restart_in_s=delay)
            await asyncio.sleep(delay)

    async def _run_once(self) -> int:
        self.proc = await asyncio.create_subprocess_exec(
            *self.command(), env=self.environment(), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent)
        self._log.info("worker_started", pid=self.proc.pid, command=self.command())
        pump = asyncio.ensure_future(self._pump(self.proc))
        gate = asyncio.ensure_future(self._gate())
        try:
            return await self.proc.wait()
        finally:
            gate.cancel()
            self.healthy.clear()
            self.route.upstreams.remove(self.url)
            await asyncio.wait([pump], timeout=1)

    async def _pump(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            self._log.info("worker_output", line=line.decode("utf-8", "replace").rstrip())

    async def _gate(self) -> None:
        """Register the worker as an upstream once its health endpoint answers 200."""
        deadline = time.monotonic() + self.cfg.startup_timeout
        health = self.url + self.route.backend.health_path()
        while time.monotonic() < deadline:
            if await self.client.probe(health, timeout=2.0) == 200:
                self.route.upstreams.add(self.url)
                self.healthy.set()
                self._log.info("worker_healthy")
                return
            await asyncio.sleep(0.1)
        self._log.error("worker_unhealthy", startup_timeout_s=self.cfg.startup_timeout)
        await self._signal(signal.SIGKILL)

    async def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; the whole process group."""
        self._stopping = True
        self.route.upstreams.remove(self.url)
        if self.proc is None or self.proc.returncode is not None:
            return
        await self._signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), grace)
        except TimeoutError:
            await self._signal(signal.SIGKILL)
            await self.proc.wait()

    async def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)


class Supervisor:
    """All managed workers of a config."""

    def __init__(self, cfg: config.Config, router: routing.Router,
                 client: upstream.UpstreamClient):
        self.workers = [ManagedWorker(w, router.routes[router.resolve(w.model).name], client)
                        for w in cfg.workers]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, wait_for_simulators: float = 20.0) -> None:
        self._tasks = [asyncio.ensure_future(w.run()) for w in self.workers]
        quick = [w.healthy.wait() for w in self.workers if w.cfg.kind == "simulator"]
        if quick:
            await asyncio.wait_for(asyncio.gather(*quick), wait_for_simulators)

    async def stop(self, grace: float = 10.0) -> None:
        await asyncio.gather(*(w.stop(grace) for w in self.workers))
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
