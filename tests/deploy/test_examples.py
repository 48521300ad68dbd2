"""Every shipped config is valid by `gateway check-config`, and its workers speak its models'
protocols: deploy/examples/*.yaml and the overlays' config.yaml (what the ConfigMaps carry)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import config
from tests.deploy import DEPLOY, ROOT

CONFIGS = sorted([*DEPLOY.glob("examples/*.yaml"), *DEPLOY.glob("k8s/overlays/*/config.yaml")])
IDS = [str(p.relative_to(DEPLOY)) for p in CONFIGS]

# The worker protocol each managed worker kind speaks (gateway/supervisor.py: a simulator
# speaks vLLM's API). A model fed by a worker of another protocol would be mistranslated.
WORKER_PROTOCOL = {"vllm": "vllm", "trtllm": "trtllm", "simulator": "vllm"}


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    """`gateway check-config PATH` as a user runs it (`python -m gateway` is that command),
    without GATEWAY_* variables from the caller's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(config.ENV_PREFIX)}
    return subprocess.run([sys.executable, "-m", "gateway", "check-config", str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_every_topology_has_configs() -> None:
    names = {p.name for p in DEPLOY.glob("examples/*.yaml")}
    assert {"vllm.yaml", "trtllm.yaml", "ingress.yaml", "local.yaml"} <= names
    assert {p.parent.name for p in DEPLOY.glob("k8s/overlays/*/config.yaml")} == {
        "ingress", "sidecar"}


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_check_config_accepts(path: Path) -> None:
    done = check_config(path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{path}: ok"


def test_check_config_rejects_a_broken_copy(tmp_path: Path) -> None:
    """The check above is real: one misspelt key in an example fails, naming its location."""
    text = (DEPLOY / "examples" / "vllm.yaml").read_text()
    broken = tmp_path / "vllm.yaml"
    broken.write_text(text.replace("startup_timeout:", "startup_timout:", 1))
    done = check_config(broken)
    assert done.returncode == 1
    assert "workers[0].startup_timout: unknown key" in done.stderr


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_workers_speak_their_models_protocol(path: Path) -> None:
    cfg = config.load_config(path, {})
    backends = {name: m.backend for m in cfg.models for name in (m.name, *m.aliases)}
    for i, w in enumerate(cfg.workers):
        assert backends[w.model] == WORKER_PROTOCOL[w.kind], f"{path}: workers[{i}]"


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_every_model_can_be_served(path: Path) -> None:
    """No model without upstreams and without a managed worker: it would answer only 503."""
    cfg = config.load_config(path, {})
    managed = {w.model for w in cfg.workers}
    for m in cfg.models:
        assert m.upstreams or m.name in managed, f"{path}: model {m.name!r} has no upstream"
