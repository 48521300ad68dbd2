"""`gateway serve` and the signals Kubernetes sends: SIGTERM (or SIGINT) at any point of its
life ends it with exit code 0 and no process left behind (SPEC.md, Behaviour: SIGTERM stops
accepting, finishes in-flight streams within a grace, then exits)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration import procs

pytestmark = pytest.mark.integration

# A fast worker (the simulator: startup waits for it) that never becomes healthy: it exits at
# once on an unknown flag and is restarted with backoff.
NEVER_HEALTHY = ("default_model: demo\n"
                 "workers: [{kind: simulator, model: demo, args: [--no-such-flag]}]\n")


def _events(proc: procs.Proc) -> list[dict[str, object]]:
    out = []
    for line in proc.output().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _wait_event(proc: procs.Proc, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.get("event") == name for e in _events(proc)):
            return
        assert proc.popen.poll() is None, proc.output()
        time.sleep(0.02)
    raise TimeoutError(f"no {name} event:\n{proc.output()}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_signal_while_a_worker_starts_ends_the_start_with_exit_0(
        tmp_path: Path, sig: signal.Signals, workers: str) -> None:
    """SIGTERM while start-up waits for a managed worker to become healthy (a pod deleted as
    it starts): the gateway waited on for the whole 20 s, exited 1 (`serve_failed`, the worker
    not healthy), and with a worker that did come up it opened its port after the signal.
    Now the signal ends the start: the workers are stopped, nothing listens, exit 0."""
    port = procs.free_port()
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(NEVER_HEALTHY)
    proc = procs.Proc([sys.executable, "-m", "gateway", "serve", "--config", str(cfg),
                       "--host", "127.0.0.1", "--port", str(port), "--workers", workers],
                      tmp_path / "gateway.log")
    try:
        _wait_event(proc, "worker_started")
        pids = procs.children_of(proc.pid)
        started = time.monotonic()
        proc.popen.send_signal(sig)
        code = proc.popen.wait(15)
        took = time.monotonic() - started
    finally:
        proc.stop(signal.SIGKILL)
    events = [e.get("event") for e in _events(proc)]
    assert code == 0, proc.output()
    assert took < 10, took
    assert "listening" not in events and "serve_failed" not in events
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(procs.alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(procs.alive(p) for p in pids)


# `gateway serve` whose app is built only after a signal has come: the signal arrives while
# the gateway still imports and builds (before its server and its handlers exist).
_SIGNALLED_WHILE_BUILDING = """
import os, signal, sys
from gateway import app, cli
real = app.build_app
def build(*args, **kwargs):
    os.kill(os.getpid(), signal.{sig})
    return real(*args, **kwargs)
app.build_app = build
sys.exit(cli.main(["serve", "--config", sys.argv[1], "--host", "127.0.0.1", "--port", "0"]))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_before_the_server_runs_ends_it_with_exit_0(tmp_path: Path, sig: str) -> None:
    """A pod deleted within its first second or two: the signal came while the gateway
    imported its modules and built its app, before any handler was set, so SIGTERM killed
    it (exit status 143, -15 to its parent) and SIGINT printed a KeyboardInterrupt
    traceback. Nothing has started then: the gateway exits 0 at once."""
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(NEVER_HEALTHY)
    done = subprocess.run([sys.executable, "-c", _SIGNALLED_WHILE_BUILDING.format(sig=sig),
                           str(cfg)], cwd=procs.ROOT, capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert '"worker_started"' not in done.stderr and '"listening"' not in done.stderr
