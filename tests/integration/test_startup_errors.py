"""`gateway serve` that cannot start says why in one readable line and exits non-zero: never
a traceback, never a server listening somewhere else than asked (SPEC.md, Command line)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration import procs

pytestmark = pytest.mark.integration

CONFIG = "models: [{name: a, upstreams: ['http://127.0.0.1:9']}]\n"


def serve(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG)
    return subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(path),
                           *flags], cwd=procs.ROOT, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_is_one_error_line_and_exit_1(tmp_path: Path, workers: str) -> None:
    """The bind's OSError is the operator's to fix, not a bug: logged as `serve_failed` with
    the address and the system's words, without the traceback a bug gets."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = serve(tmp_path, "--host", "127.0.0.1", "--port", str(port), "--workers", workers)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout
    failed = [json.loads(line) for line in done.stderr.splitlines()
              if '"serve_failed"' in line]
    assert len(failed) == 1 and failed[0]["port"] == port
    assert "in use" in failed[0]["error"]


def test_a_host_that_is_not_one_is_one_error_line(tmp_path: Path) -> None:
    done = serve(tmp_path, "--host", "not a host!!", "--port", "0")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert '"serve_failed"' in done.stderr and "not a host!!" in done.stderr


@pytest.mark.parametrize("port", ["70000", "-1", "80x"])
def test_a_port_flag_out_of_range_is_refused_not_wrapped(tmp_path: Path, port: str) -> None:
    """The socket layer takes 70000 as 70000 mod 65536 (it listened on 4464); server.port
    refuses it in the file, and `--port` now does the same (argparse's usage error, exit 2)."""
    done = serve(tmp_path, "--host", "127.0.0.1", f"--port={port}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--port" in done.stderr and "0-65535" in done.stderr


@pytest.mark.parametrize("flags", [[], ["--port", "18000"]], ids=["config", "flag"])
def test_a_worker_on_the_gateways_own_port_is_one_error_line(tmp_path: Path,
                                                              flags: list[str]) -> None:
    """A managed vLLM left on vLLM's own default port 8000 with the gateway moved there too
    (`server.port: 8000`, or `--port`): the gateway listened first and vLLM failed to bind,
    restarted with backoff while /health stayed 503 (or, a worker up first, the gateway
    failed on "address in use"), depending on which was quicker. The clash is now one
    `config_error` naming the worker, exit 1, before anything starts."""
    port = "18000" if flags else "8000"
    path = tmp_path / "gateway.yaml"
    path.write_text(("server: {port: 8000}\n" if not flags else "")
                    + f"workers: [{{kind: vllm, model: m, port: {port}}}]\n")
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(path),
                           *flags], cwd=procs.ROOT, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr
    errors = [json.loads(line) for line in done.stderr.splitlines()
              if '"config_error"' in line]
    assert len(errors) == 1
    assert errors[0]["message"].startswith(f"workers[0].port: {port} is the gateway's own")
    assert '"worker_started"' not in done.stderr and '"listening"' not in done.stderr
