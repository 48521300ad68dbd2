"""Real processes for integration tests: free loopback ports, bounded waits, stop by own PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process started for a test, with its log file."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None):
        self.log = log
        self._out = log.open("wb")
        self.popen = subprocess.Popen(
            args, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})})

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_http(self, url: str, timeout: float = 20.0) -> None:
        """Until `url` answers 200; fails with the log if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"process exited {self.popen.returncode}:\n{self.output()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{url} not healthy within {timeout}s:\n{self.output()}")

    def output(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM, grace: float = 10.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._out.close()
        return self.popen.returncode


def simulator(tmp: Path, *args: str) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([sys.executable, "-m", "simulator", "--host", "127.0.0.1",
                 "--port", str(port), *args], tmp / f"sim-{port}.log")
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health")
    return proc, url


def gateway(tmp: Path, config_text: str | None, env: dict[str, str] | None = None) -> tuple[Proc, str]:
    port = free_port()
    args = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port)]
    if config_text is not None:
        cfg = tmp / f"gateway-{port}.yaml"
        cfg.write_text(config_text)
        args += ["--config", str(cfg)]
    proc = Proc(args, tmp / f"gateway-{port}.log", env)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(url + "/health", timeout=30)
    return proc, url


@contextmanager
def demo_gateway(tmp: Path, server: str, *sim_args: str) -> Iterator[tuple[str, str]]:
    """A gateway whose one model `demo` (vllm) is one simulator, with `server` (a YAML flow
    mapping) as its server section: (gateway URL, simulator URL); both stopped at the end."""
    sim, sim_url = simulator(tmp, *sim_args)
    try:
        gw, gw_url = gateway(tmp, f"server: {server}\ndefault_model: demo\nmodels:\n"
                             f"  - {{name: demo, backend: vllm, upstreams: [{sim_url}]}}\n")
    except BaseException:
        sim.stop()
        raise
    try:
        yield gw_url, sim_url
    finally:
        gw.stop()
        sim.stop()


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def holder(server_port: int, client_port: int, pids: list[int]) -> int | None:
    """Which of `pids` holds the server side of the loopback TCP connection between
    `server_port` and `client_port` (from /proc/net/tcp and each process's open files)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)) == \
                (server_port, client_port):
            inode = fields[9]
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def cmdline(pid: int) -> str:
    """The command line of `pid`, its words joined by spaces; empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def status(pid: int, field: str) -> str:
    """A field of /proc/<pid>/status (`VmRSS` -> "67048 kB")."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return value.strip()
    raise KeyError(field)


def refused_within(host: str, port: int, seconds: float) -> bool:
    """Whether connecting to (host, port) is refused within `seconds` (a connection still
    accepted meanwhile is closed at once): the listening sockets closed, however loaded the
    machine that delivers the signal."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=2).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.05)
    return False
