"""`server.workers: N`: N serving processes on one port; managed workers run once, by the parent.

The parent binds N listening sockets to the port with SO_REUSEPORT and hands one to each
serving process (spawned; the gateway's own server on uvloop): the kernel spreads new
connections over the sockets by their address hash, where one shared accept queue would wake
every process for each connection and let the quickest take most of them. The parent keeps the
sockets, so a serving process that dies is restarted on its own socket and what queued there
meanwhile is still served. The managed workers (`workers:`) are started, restarted and stopped
by the parent alone; each serving process gates them into its own rotation by probing their
health route (the same gate as one process uses). What one process learns of an upstream's
health (an ejection, a probe's verdict) the others take on (gateway.board, in a directory the
parent makes and removes), so /health answers alike in every process; so does their count of
requests in flight, which `server.max_concurrent_requests` limits for the whole gateway
(gateway.admission). Metrics:
prometheus_client's multiprocess mode, in another such directory; /metrics in any process
sums them all. SIGTERM or SIGINT to the parent: SIGTERM to every serving process (each drains
its streams for `server.drain_seconds`) and the parent's copies of the sockets closed, so new
connections are refused; then the workers stop. A signal while the managed workers still
start ends the start: no serving process is started, the workers stop, exit code 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import tempfile
from multiprocessing.process import BaseProcess
from typing import Any

from gateway import (
    admission,
    board,
    config,
    http1,
    listener,
    metrics,
    observability,
    routing,
    supervisor,
)

RESTART_SECONDS = 1.0  # before a serving process that died is started again; doubled per
# death in a row up to the managed workers' cap, a run of their reset length starting again
BACKLOG = 2048  # uvicorn's own default


def count(setting: int | str, cgroup: str = "/sys/fs/cgroup") -> int:
    """Serving processes for `server.workers`: `auto` is the CPUs this process may use, the
    fewer of its affinity mask and its cgroup's CPU quota (a pod's `resources.limits.cpu`,
    rounded up), so that a pod limited to 2 CPUs on a 64-core node runs 2, not 64."""
    if setting != "auto":
        return int(setting)
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_cpus(cgroup)
    return max(1, min(cpus, quota)) if quota is not None else cpus


def cgroup_cpus(root: str = "/sys/fs/cgroup") -> int | None:
    """CPUs the cgroup's quota allows (v2 `cpu.max`, else v1 `cpu.cfs_quota_us` over
    `cpu.cfs_period_us`), rounded up; None where no quota is set or none can be read."""
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            quota, _, period = f.read().strip().partition(" ")
        if quota == "max":
            return None
        return math.ceil(int(quota) / int(period or 100_000))
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
            quota_us = int(f.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
            period_us = int(f.read())
    except (OSError, ValueError):
        return None
    return math.ceil(quota_us / period_us) if quota_us > 0 and period_us > 0 else None


# The most open files asked for (where the hard limit is higher or unlimited).
OPEN_FILES_CAP = 1_048_576


def raise_open_files_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit; the soft limit now in force.

    Each stream holds two descriptors (its client and its worker connection) and idle
    keep-alive connections hold one each, so `max_concurrent_requests` (1024) needs well over
    2,048 where many hosts and shells start processes at a soft limit of 1,024. Past it,
    accepts and worker connects fail with EMFILE. The hard limit is the operator's ceiling;
    the soft one is the process's own to raise (vLLM's server does the same). Serving
    processes inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES_CAP if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_CAP)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):  # a sandbox that refuses: keep what was given
            return soft
        return want
    return soft


def tune_collector() -> None:
    """Fewer young-generation collections, in every serving process (and the benchmark's):
    a request allocates many short-lived containers (the benchmark's profile once showed the
    collector at 5 % of the gateway's CPU), and leaves no cycle for it (bench/RESULTS.md §20)."""
    gc.set_threshold(20_000, 20, 20)


def server(app: Any, cfg: config.ServerConfig) -> listener.Server:
    """The server of every serving process: the gateway's own (gateway.http_server, on
    uvloop; see README, Performance)."""
    return listener.Server(app, cfg)


def uvicorn_server(app: Any, cfg: config.ServerConfig, log_level: str = "warning") -> Any:
    """uvicorn in the same setup, for the benchmark's comparison (bench/run_gateway.py
    --server uvicorn): uvloop and httptools, no access log (the gateway writes its own line per
    request), uvicorn's loggers left to the JSON handler `observability.configure` set
    (log_config=None), and no X-Forwarded-* rewriting of the client address."""
    import uvicorn

    class Server(uvicorn.Server):
        """Logs `drain` when a signal ends serving (in-flight streams then get
        `timeout_graceful_shutdown`, before the lifespan's shutdown logs `stop`)."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                observability.logger().info(
                    "drain", signal=signal.Signals(sig).name,
                    drain_seconds=self.config.timeout_graceful_shutdown)
            super().handle_exit(sig, frame)

    return Server(uvicorn.Config(
        app, host=cfg.host, port=cfg.port, loop="uvloop", http="httptools", lifespan="on",
        log_level=log_level, log_config=None, access_log=False, backlog=BACKLOG,
        proxy_headers=False, timeout_graceful_shutdown=round(cfg.drain_seconds)))


def serve(cfg: config.Config, n: int, log_level: str) -> int:
    """Run `n` serving processes and the managed workers until SIGTERM/SIGINT; exit code."""
    cfg = fixed_worker_ports(cfg)
    socks = listeners(cfg.server.host, cfg.server.port, n)
    # The managed workers get the environment as it was: vLLM takes a set
    # PROMETHEUS_MULTIPROC_DIR as its own and would share the serving processes' directory.
    worker_env = dict(os.environ)
    metrics_dir = tempfile.mkdtemp(prefix="gateway-metrics-")
    os.environ[metrics.MULTIPROC_ENV] = metrics_dir  # read by the spawned processes at import
    shared = tempfile.mkdtemp(prefix="gateway-upstreams-")
    try:
        import uvloop

        uvloop.run(_parent(cfg, socks, log_level, shared, worker_env))
    finally:
        for s in socks:
            s.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)
    return 0


def fixed_worker_ports(cfg: config.Config) -> config.Config:
    """Managed workers without a port get a free one now: every serving process must probe
    the very URL that the parent's worker listens on."""
    fixed = tuple(w if w.port else w.model_copy(update={"port": supervisor.free_port(w.host)})
                  for w in cfg.workers)
    return cfg.model_copy(update={"workers": fixed})


def listeners(host: str, port: int, n: int) -> list[socket.socket]:
    """`n` listening sockets on one port (the first fixes it when `port` is 0).

    SO_REUSEPORT would let a second gateway of the same user join the port and take half of
    its connections; a socket without it cannot bind where anyone listens, so one is bound
    first, and the port is refused as in use (as with one process) if that fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if port:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(family, socket.SOCK_STREAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind((host, port))
            port = s.getsockname()[1]
            s.listen(BACKLOG)
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


async def _parent(cfg: config.Config, socks: list[socket.socket], log_level: str,
                  shared: str, worker_env: dict[str, str]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = http1.Http1Client(cfg.server.timeouts.connect)
    # the serving processes take a worker's exit and return from here (gateway.board)
    workers = supervisor.Supervisor(cfg, routing.Router(cfg, shared=board.Board(shared)), client,
                                    environ=worker_env)
    try:
        starting = asyncio.ensure_future(workers.start())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if stop.is_set():  # a signal while a worker still starts: no serving process
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return
        await starting  # its error (a fast worker never healthy) ends the start
        slots = admission.Slots(shared, len(socks))
        kept = [ServingProcess(cfg, s, log_level, shared, slots, i) for i, s in enumerate(socks)]
        tasks = [asyncio.ensure_future(p.keep(stop)) for p in kept]
        await stop.wait()
        for p in kept:
            p.signal(signal.SIGTERM)
        # Stop accepting (SPEC.md): each serving process closes its copy of its socket as it
        # drains; the parent's copies would keep the port listening, and the kernel would
        # complete handshakes no process accepts until the drain ends, then reset them.
        for s in socks:
            s.close()
        _, late = await asyncio.wait(tasks, timeout=cfg.server.drain_seconds + 5)
        for p in kept:
            p.signal(signal.SIGKILL)
        await asyncio.gather(*late, return_exceptions=True)
    finally:
        await workers.stop()
        await client.aclose()


class ServingProcess:
    """One serving process on its socket, started again if it dies before the parent stops."""

    def __init__(self, cfg: config.Config, sock: socket.socket, log_level: str, shared: str,
                 slots: admission.Slots, index: int):
        self.cfg = cfg
        self.sock = sock
        self.log_level = log_level
        self.shared = shared  # gateway.board's directory
        self.slots, self.index = slots, index  # its in-flight count (gateway.admission)
        self.proc: BaseProcess | None = None

    async def keep(self, stop: asyncio.Event) -> None:
        log = observability.logger()
        loop = asyncio.get_running_loop()
        deaths = 0  # in a row: a process that crashes as it starts is not restarted each second
        while not stop.is_set():
            started = loop.time()
            self.proc = multiprocessing.get_context("spawn").Process(
                target=run_child, args=(self.cfg.model_dump(mode="json"), self.sock,
                                        self.log_level, self.shared, self.index), daemon=False)
            self.proc.start()
            await _exited(self.proc)
            self.slots.clear(self.index)  # what it had admitted is gone with it
            if self.proc.pid is not None:
                metrics.process_gone(self.proc.pid)
            if stop.is_set():
                return
            lived = loop.time() - started
            deaths = 1 if lived >= supervisor.RESTART_RESET_SECONDS else deaths + 1
            delay = restart_delay(deaths)
            log.warning("serving_process_exited", pid=self.proc.pid, code=self.proc.exitcode,
                        restart_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.exitcode is None and self.proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)


def restart_delay(deaths: int) -> float:
    """1, 2, 4 ... 30 s before a serving process that died `deaths` times in a row restarts."""
    return supervisor.restart_delay(deaths, RESTART_SECONDS)


async def _exited(proc: BaseProcess) -> None:
    """Until `proc` exits: its sentinel fd becomes readable (no polling, no thread)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)
    loop.add_reader(proc.sentinel, readable)
    try:
        await done
    finally:
        loop.remove_reader(proc.sentinel)
    proc.join()


def run_child(raw: dict[str, Any], sock: socket.socket, log_level: str, shared: str,
              slot: int) -> None:
    """A serving process: the gateway app on the inherited socket, workers gated by health,
    upstream health and requests in flight (its own in `slot`) shared with the other
    processes through `shared` (gateway.board, gateway.admission). The
    config travels as its JSON form (the assembled config classes do not pickle)."""
    parent = multiprocessing.parent_process()
    supervisor.die_with_parent(parent.pid if parent is not None else None)
    cfg = config.Config.model_validate(raw)
    import structlog

    from gateway import app, tracing

    observability.configure(log_level)
    # every log line of this process names it: which process served a request
    structlog.contextvars.bind_contextvars(pid=os.getpid())
    tune_collector()
    application = app.build_app(cfg, traces=tracing.from_env(cfg.server.tracing, os.environ),
                                manage_workers=False, shared=shared, slot=slot)
    raise SystemExit(server(application, cfg.server).run(sockets=[sock]))
