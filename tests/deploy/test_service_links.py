"""Kubernetes service links never break the gateway (issue 12).

The kubelet injects `<SERVICE>_SERVICE_HOST`, `<SERVICE>_PORT=tcp://IP:PORT`, ... for every
Service of the namespace into every pod that does not set `enableServiceLinks: false`
(kubernetes pkg/kubelet/envvars/envvars.go FromServices). A Service named `gateway` thus makes
`GATEWAY_*` variables. Every pod spec of both overlays turns them off, and, should a cluster
inject them anyway, every shipped config still loads and the gateway still starts with them:
each such variable is a warning naming it.
"""

from __future__ import annotations

import ipaddress
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway import config
from tests.deploy import DEPLOY
from tests.deploy.test_examples import CONFIGS, IDS
from tests.deploy.test_manifests import OVERLAYS, Obj, render
from tests.integration import procs


def service_links(services: list[Obj]) -> dict[str, str]:
    """envvars.go FromServices: per Service (its name upper-cased, `-` as `_`), the host, the
    first port, each named port, and the Docker-link style `_PORT*` variables per port. The
    kubelet skips headless Services; they get a made-up address here, so that every Service
    of the overlays is covered."""
    env: dict[str, str] = {}
    for n, svc in enumerate(services):
        spec: dict[str, Any] = svc["spec"]
        ip = spec.get("clusterIP")
        if not ip or ip == "None":
            ip = str(ipaddress.ip_address("10.96.0.10") + n)
        name = svc["metadata"]["name"].upper().replace("-", "_")
        ports = spec["ports"]
        env[f"{name}_SERVICE_HOST"] = ip
        env[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        for p in ports:
            if p.get("name"):
                env[f"{name}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(p["port"])
        first = ports[0]
        env[f"{name}_PORT"] = f"{first.get('protocol', 'TCP').lower()}://{ip}:{first['port']}"
        for p in ports:
            proto = p.get("protocol", "TCP")
            prefix = f"{name}_PORT_{p['port']}_{proto}"
            env[prefix] = f"{proto.lower()}://{ip}:{p['port']}"
            env[f"{prefix}_PROTO"] = proto.lower()
            env[f"{prefix}_PORT"] = str(p["port"])
            env[f"{prefix}_ADDR"] = ip
    return env


@pytest.fixture(scope="module")
def links() -> dict[str, str]:
    services = [o for overlay in OVERLAYS for o in render(overlay) if o["kind"] == "Service"]
    assert {s["metadata"]["name"] for s in services} >= {"gateway", "vllm-workers"}
    env = service_links(services)
    assert {"GATEWAY_SERVICE_HOST", "GATEWAY_SERVICE_PORT", "GATEWAY_PORT",
            "GATEWAY_PORT_80_TCP_ADDR", "GATEWAY_SERVICE_PORT_HTTP"} <= set(env)
    return env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_spec_turns_service_links_off(overlay: str) -> None:
    pods = [o["spec"]["template"]["spec"] for o in render(overlay)
            if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]
    assert pods
    assert all(p.get("enableServiceLinks") is False for p in pods)


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_every_config_loads_with_the_service_links(path: Path, links: dict[str, str]) -> None:
    warnings: list[str] = []
    plain = config.load_config(path, {})
    cfg = config.load_config(path, {**links, "GATEWAY_FOO": "1"}, warnings)
    assert cfg == plain  # nothing of the links reached a setting
    stray = sorted(k for k in {**links, "GATEWAY_FOO": "1"} if k.startswith("GATEWAY_"))
    named = sorted(w.split(":", 1)[0] for w in warnings if w.startswith("GATEWAY_"))
    assert named == stray


def test_real_overrides_still_apply_beside_the_links(links: dict[str, str]) -> None:
    path = DEPLOY / "examples" / "ingress.yaml"
    cfg = config.load_config(path, {**links, "GATEWAY_SERVER__PORT": "9000",
                                    "GATEWAY_MODELS__1__UPSTREAMS": "[http://trt:8001]"})
    assert cfg.server.port == 9000 and cfg.models[1].upstreams == ("http://trt:8001",)


def test_an_invalid_override_names_its_variable() -> None:
    with pytest.raises(config.ConfigError) as err:
        config.load_config(DEPLOY / "examples" / "local.yaml",
                           {"GATEWAY_SERVER__TIMEOUTS__IDLE": "soon"})
    assert err.value.problems == [
        "server.timeouts.idle: Input should be a valid number, unable to parse string as a "
        "number (set by GATEWAY_SERVER__TIMEOUTS__IDLE)"]


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_the_gateway_starts_with_the_service_links(path: Path, links: dict[str, str],
                                                   tmp_path: Path) -> None:
    """`gateway serve` with each shipped config and every link variable in its environment
    answers HTTP (GET /v1/models; /health may wait on workers that need a GPU)."""
    port = procs.free_port()
    proc = procs.Proc([sys.executable, "-m", "gateway", "serve", "--config", str(path),
                       "--host", "127.0.0.1", "--port", str(port)],
                      tmp_path / "gateway.log", {**links, "GATEWAY_FOO": "1"})
    try:
        deadline = time.monotonic() + 30
        status = 0
        while time.monotonic() < deadline and proc.popen.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert status == 200, proc.output()
        assert "GATEWAY_PORT: ignored" in proc.output()
    finally:
        proc.stop(signal.SIGTERM)
