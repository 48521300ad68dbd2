"""The gateway raises its soft open-files limit to the hard one at start-up: each stream holds
two descriptors (client and worker) and each idle keep-alive connection one, where many hosts
start processes at a soft limit of 1,024 (past it, accepts fail with EMFILE)."""

from __future__ import annotations

import resource
import socket
import sys
from pathlib import Path

import httpx
import pytest

from gateway import processes
from tests.integration import procs

pytestmark = pytest.mark.integration

SOFT = 128
CONNECTIONS = 3 * SOFT  # idle keep-alive connections held at once: more than SOFT descriptors

# Lowers the soft limit, then becomes `gateway serve` (the limit carries over the exec).
LAUNCH = ("import os, resource, sys; h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
          f"resource.setrlimit(resource.RLIMIT_NOFILE, ({SOFT}, h)); "
          "os.execv(sys.executable, [sys.executable, '-m', 'gateway', *sys.argv[1:]])")


def soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open files line")


def test_started_at_a_low_soft_limit_it_serves_more_connections_than_that(
        tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < CONNECTIONS + 64:
        pytest.fail(f"this machine's hard open-files limit ({hard}) is below the test's need")
    port = procs.free_port()
    proc = procs.Proc([sys.executable, "-c", LAUNCH, "serve", "--host", "127.0.0.1",
                       "--port", str(port)], tmp_path / "gateway.log")
    url = f"http://127.0.0.1:{port}"
    held: list[socket.socket] = []
    try:
        proc.wait_http(url + "/health", timeout=30)
        want = processes.OPEN_FILES_CAP if hard == resource.RLIM_INFINITY else \
            min(hard, processes.OPEN_FILES_CAP)
        assert soft_limit(proc.pid) == want
        assert f'"open_files":{want}' in proc.output()
        for _ in range(CONNECTIONS):  # each served once, then kept idle by the gateway
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
            held.append(s)
        body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 200, r.text
    finally:
        for s in held:
            s.close()
        proc.stop()


def test_the_soft_limit_is_raised_to_the_hard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "setrlimit", lambda _k, v: calls.append(v))
    for (soft, hard), want in (((1024, 4096), 4096), ((4096, 4096), 4096),
                               ((1024, resource.RLIM_INFINITY), processes.OPEN_FILES_CAP),
                               ((1024, 1 << 40), processes.OPEN_FILES_CAP)):
        calls.clear()
        monkeypatch.setattr(resource, "getrlimit", lambda _k, v=(soft, hard): v)
        assert processes.raise_open_files_limit() == want
        assert calls == ([] if soft == want else [(want, hard)])

    def refuse(_k: int, _v: tuple[int, int]) -> None:
        raise ValueError("not allowed here")

    monkeypatch.setattr(resource, "setrlimit", refuse)
    monkeypatch.setattr(resource, "getrlimit", lambda _k: (1024, 4096))
    assert processes.raise_open_files_limit() == 1024  # kept, and serving goes on
