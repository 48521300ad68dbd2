"""Managed worker processes: start, gate on health, register as upstream, restart, stop.

Each worker runs as a child in its own process group with PR_SET_PDEATHSIG (SIGKILL when the
gateway dies, even by SIGKILL), and stop() signals the whole group, so no worker outlives the
gateway while that is alive to send it; only grandchildren of a gateway killed by SIGKILL are
beyond its reach. Its output goes to the structured log, a line an event. Draining: the HTTP
server (gateway.listener) finishes in-flight requests (up to `server.drain_seconds`) before the
lifespan's shutdown calls stop(), which then sends SIGTERM and, after a grace period, SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping

import tenacity

from adapters import registry
from gateway import config, observability, routing, upstream

_PR_SET_PDEATHSIG = 1
RESTART_BASE_SECONDS = 0.5  # backoff 0.5, 1, 2, 4 ... s between restarts
RESTART_MAX_SECONDS = 30.0
# A run healthy this long resets that backoff: a crash after it is not part of a crash loop.
# Long enough to span a worker that crashes under its first load, short next to the kubelet's
# 10 min (CrashLoopBackOff) since a worker here is its pod's only one in the sidecar topology.
RESTART_RESET_SECONDS = 60.0
HEALTH_PERIOD_SECONDS = 5.0  # probes of a running worker
HEALTH_FAILURES = 3  # consecutive failed probes that take it out of rotation
NOT_STARTED = 127  # a command that could not be run: the shell's "command not found"
# What is left of a worker's process group after the worker itself died (vLLM's engine
# processes, holding its GPU memory and port): SIGTERM, and SIGKILL after this, before a
# restart.
LEFTOVER_GRACE_SECONDS = 5.0
GROUP_POLL_SECONDS = 0.05


def restart_delay(crashes: int, base: float | None = None) -> float:
    """`base` (RESTART_BASE_SECONDS), doubled per crash in a row after the first, up to
    RESTART_MAX_SECONDS."""
    first = RESTART_BASE_SECONDS if base is None else base
    return min(first * 2.0 ** max(crashes - 1, 0), RESTART_MAX_SECONDS)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """Whether a server listens on `host:port` already: a bind there fails (SO_REUSEADDR, so
    that connections of an earlier run in TIME_WAIT do not count; no SO_REUSEPORT, so that a
    server that set it, as vLLM does, still counts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def die_with_parent(parent: int | None = None) -> None:
    """SIGKILL this process when its parent dies (runs in a worker between fork and exec, and
    first thing in a serving process of several). A parent that died before this ran sends
    nothing: prctl(2) says to check the parent's pid afterwards, and a serving process is
    that late (an interpreter's start and imports); without the check, a gateway killed while
    it started left its serving processes listening on its port, orphans. `parent`: the pid
    of the process that started this one."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)  # what the signal would have done


# Words of a flag whose value is a credential (vLLM's `--api-key`, `--hf-token`), not a
# path or a count (`--tokenizer`, `--ssl-keyfile`).
_SECRET_WORDS = frozenset({"key", "token", "secret", "password", "apikey"})


def shown(argv: list[str]) -> list[str]:
    """A worker's command line as its log line shows it: the value of a credential flag
    (`--api-key X` or `--api-key=X`) masked, the rest as run."""
    out: list[str] = []
    masking = False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        words = flag.lstrip("-").lower().replace("_", "-").split("-")
        secret = arg.startswith("-") and not _SECRET_WORDS.isdisjoint(words)
        out.append("***" if masking and not arg.startswith("-")
                   else f"{flag}=***" if secret and eq else arg)
        masking = secret and not eq
    return out


class ManagedWorker:
    """One configured worker process and its life cycle."""

    def __init__(self, cfg: config.WorkerConfig, route: routing.Route,
                 client: upstream.UpstreamClient, environ: Mapping[str, str] | None = None):
        self.cfg = cfg
        self.route = route
        self.client = client
        self.environ = environ  # what the worker's environment starts from (None: os.environ)
        self.port = cfg.port or free_port(cfg.host)
        self.url = f"http://{cfg.host}:{self.port}"
        self.kind = registry.WORKER_KINDS[cfg.kind]
        self.proc: asyncio.subprocess.Process | None = None
        self.healthy = asyncio.Event()
        self.restarts = 0
        self.crashes = 0  # in a row: since the last run that stayed healthy
        self.healthy_since: float | None = None  # this run's registration (monotonic)
        self._stopping = False
        self._watching = False  # gating a worker that another process runs (watch)
        self._log = observability.logger().bind(worker=cfg.kind, model=cfg.model, port=self.port)

    def command(self) -> list[str]:
        """The real command line of this kind of worker (registry.WORKER_KINDS)."""
        return [*self.kind.argv(python=sys.executable, model=self.route.upstream_model,
                                host=self.cfg.host, port=self.port), *self.cfg.args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ if self.environ is None else self.environ)
        env.update(self.cfg.env)
        if self.cfg.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.cfg.gpus
        return env

    async def run(self) -> None:
        """Start, and restart with exponential backoff while the policy says so."""
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_result(self._should_restart),
            wait=self._restart_delay,
            before_sleep=self._log_restart,
            stop=tenacity.stop_never,
        )
        await retrying(self._run_once)

    def _should_restart(self, code: int) -> bool:
        if self._stopping or self.cfg.restart == "never":
            return False
        return self.cfg.restart == "always" or code != 0

    def _restart_delay(self, state: tenacity.RetryCallState) -> float:
        """0.5, 1, 2 ... 30 s, doubling per crash in a row (a run that stayed healthy for
        RESTART_RESET_SECONDS starts the count again)."""
        return restart_delay(self.crashes)

    def _log_restart(self, state: tenacity.RetryCallState) -> None:
        self.restarts += 1
        code = state.outcome.result() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0
        self._log.warning("worker_exited", code=code, restart_in_s=round(delay, 3),
                          restarts=self.restarts)

    async def _run_once(self) -> int:
        if self._stopping:  # stop() came while the restart was being decided
            return 0
        if port_in_use(self.cfg.host, self.port):
            # Another server there would answer the worker's health probe: it would be put in
            # rotation as this worker while the worker itself failed to bind.
            self.crashes += 1
            self._log.error("worker_start_failed", command=shown(self.command()),
                            error=f"port {self.port} on {self.cfg.host} is in use by another "
                                  f"process")
            return NOT_STARTED
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command(), env=self.environment(), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True, preexec_fn=functools.partial(die_with_parent, os.getpid()))
        except OSError as exc:  # not installed, not executable: said, and tried again later
            self.crashes += 1
            self._log.error("worker_start_failed", command=shown(self.command()),
                            error=f"{type(exc).__name__}: {exc}")
            return NOT_STARTED
        self._log.info("worker_started", pid=self.proc.pid, command=shown(self.command()))
        self._announce(True)
        if self._stopping:  # stop() came while it was being started: it found the last run
            await _end_group(self.proc, 0)
            return await self.proc.wait()
        self.healthy_since = None
        pump = asyncio.ensure_future(self._pump(self.proc))
        gate = asyncio.ensure_future(self._gate(time.monotonic() + self.cfg.startup_timeout))
        try:
            return await self.proc.wait()
        finally:
            stable = (self.healthy_since is not None
                      and time.monotonic() - self.healthy_since >= RESTART_RESET_SECONDS)
            self.crashes = 1 if stable else self.crashes + 1
            gate.cancel()
            self.healthy.clear()
            self._announce(False)
            self.route.upstreams.remove(self.url)
            if not self._stopping:  # else stop() ends the group, with its own grace
                await _end_group(self.proc, LEFTOVER_GRACE_SECONDS)
            await asyncio.wait([pump], timeout=1)

    async def _pump(self, proc: asyncio.subprocess.Process) -> None:
        """The worker's output to the log, line by line, until it closes. A line over the
        reader's limit (64 KiB) is dropped, not the end of the pump: a pump that ended left the
        pipe unread, and a worker whose pipe is full blocks on its next write."""
        out = proc.stdout
        assert out is not None
        while True:
            try:
                line = await out.readline()
            except ValueError:  # asyncio.StreamReader.readline: over the limit, dropped
                self._log.info("worker_output", line="(a line over 64 KiB, dropped)")
                continue
            if not line:
                return
            self._log.info("worker_output", line=line.decode("utf-8", "replace").rstrip())

    def _announce(self, running: bool) -> None:
        """To the serving processes (gateway.board): whether this worker's process runs."""
        if (shared := self.route.upstreams.board) is not None:
            shared.set_running(self.route.name, self.url, running)

    async def watch(self) -> None:
        """Health only: in a serving process of several, the parent runs the worker process
        and each serving process gates it into its own rotation by probing it, while the
        parent says it runs (another server may answer on its port)."""
        self._watching = True
        await self._gate(None)

    async def _passes(self, health: str) -> bool:
        """Its health route answers 200, and (watching) the parent runs it."""
        if await upstream.probe(self.client, health, timeout=2.0) != 200:
            return False
        shared = self.route.upstreams.board
        return not self._watching or shared is None or shared.running(self.route.name, self.url)

    async def _gate(self, deadline: float | None) -> None:
        """Register the worker as an upstream once its health endpoint answers 200; then
        keep probing, and take it out of rotation while it fails (back in when it recovers).
        Past `deadline` without a first 200 the worker is killed (None: wait on)."""
        health = self.url + self.route.backend.health_path()
        while not await self._passes(health):
            if deadline is not None and time.monotonic() > deadline:
                self._log.error("worker_unhealthy", startup_timeout_s=self.cfg.startup_timeout)
                await self._signal(signal.SIGKILL)
                return
            await asyncio.sleep(0.1)
        self.route.upstreams.add(self.url)
        self.healthy.set()
        if deadline is not None:
            self.healthy_since = time.monotonic()
        self._log.info("worker_healthy")
        failures, out_since, limit = 0, 0.0, self.cfg.unhealthy_timeout
        while True:
            await asyncio.sleep(HEALTH_PERIOD_SECONDS)
            ok = await self._passes(health)
            failures = 0 if ok else failures + 1
            if ok and self.healthy.is_set():
                # as for a static upstream (gateway.health): a passing probe of a worker
                # whose ejection is over stands for its half-open trial
                self.route.upstreams.probed(self.url, True)
            elif ok:
                self.route.upstreams.add(self.url)
                self.healthy.set()
                self._log.info("worker_healthy")
            elif failures == HEALTH_FAILURES and self.healthy.is_set():
                self.route.upstreams.remove(self.url)
                self.healthy.clear()
                out_since = time.monotonic()
                self._log.warning("worker_unhealthy", failures=failures)
            elif (deadline is not None and limit and not self.healthy.is_set()
                  and time.monotonic() - out_since >= limit):
                await self._end_unhealthy(limit)  # its run ends: `restart` decides
                return

    async def _end_unhealthy(self, limit: float) -> None:
        """A worker out of rotation for `limit` seconds, its process still running: its group
        ended as a crashed worker's leftovers are (a hung engine may not heed SIGTERM); its
        run then ends as a crash would."""
        self._log.error("worker_unhealthy_too_long", unhealthy_timeout_s=limit)
        if self.proc is not None:
            await _end_group(self.proc, LEFTOVER_GRACE_SECONDS)

    async def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; the whole process group."""
        self._stopping = True
        self.route.upstreams.remove(self.url)
        if self.proc is not None:
            await _end_group(self.proc, grace)

    async def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            _signal_group(self.proc.pid, sig)


def _signal_group(pgid: int, sig: int) -> bool:
    """`sig` to the process group; False when it has no process left."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_running(pgid: int) -> bool:
    """Whether a process of the group still runs. A zombie does not count: an orphan that
    died waits for PID 1 to reap it, which some inits do only now and then (a second and
    more), and kill(2) still finds it."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: kill(2) is all there is
        return _signal_group(pgid, 0)
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


async def _end_group(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM to the worker's process group, SIGKILL to what is left of it after `grace`.

    The group, not the worker alone: a worker that exits on SIGTERM at once (or crashed) may
    leave processes it started (vLLM's engine processes) that would outlive the gateway,
    orphaned, holding the GPU and the port. The group is checked before each signal, as its
    id may be taken again once it is empty."""
    pgid = proc.pid
    if _group_running(pgid):
        _signal_group(pgid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while _group_running(pgid) and loop.time() < deadline:
            await asyncio.sleep(GROUP_POLL_SECONDS)
        if _group_running(pgid):
            _signal_group(pgid, signal.SIGKILL)
    await proc.wait()


class Supervisor:
    """All managed workers of a config."""

    def __init__(self, cfg: config.Config, router: routing.Router,
                 client: upstream.UpstreamClient, environ: Mapping[str, str] | None = None):
        """`environ`: the environment the workers' own start from (default: this process's)."""
        self.workers = [ManagedWorker(w, router.routes[router.resolve(w.model).name], client,
                                      environ)
                        for w in cfg.workers]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, wait_for_fast: float = 20.0, manage: bool = True) -> None:
        """Start every worker (`manage`), or only gate them by health where another process
        runs them (a serving process of several); wait (bounded) for those that start fast,
        so that the first requests find them (a GPU worker may load for minutes: serving does
        not wait)."""
        self._tasks = [asyncio.ensure_future(w.run() if manage else w.watch())
                       for w in self.workers]
        quick = [w for w in self.workers if w.kind.starts_fast]
        if not quick:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*(w.healthy.wait() for w in quick)),
                                   wait_for_fast)
        except TimeoutError:  # an OSError: `serve_failed`, one line naming them, exit 1
            down = ", ".join(f"{w.cfg.kind} for model `{w.cfg.model}` at {w.url}"
                             for w in quick if not w.healthy.is_set())
            raise TimeoutError(f"managed worker not healthy within {wait_for_fast:g}s: {down} "
                               f"(its worker_output lines say why)") from None

    async def stop(self, grace: float = 10.0) -> None:
        await asyncio.gather(*(w.stop(grace) for w in self.workers))
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
