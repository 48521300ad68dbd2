"""Both Kustomize overlays render with `kubectl kustomize`, every object validates against the
Kubernetes schemas (kubernetes-validate, offline, strict: unknown fields fail), and the objects
agree with each other and with the gateway: selectors, named ports, probes, the config in the
ConfigMap, graceful termination against `server.drain_seconds`, the HPA and the GPUs."""

from __future__ import annotations

import copy
import inspect
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from gateway import config, supervisor
from tests.deploy import DEPLOY, tool
from tests.deploy.test_examples import check_config

OVERLAYS = ("ingress", "sidecar")
# The oldest Kubernetes these manifests target (nothing newer than autoscaling/v2, policy/v1
# and startup probes is used) and the newest that kubernetes-validate bundles.
VERSIONS = ("1.29.0", "1.37.0")

Obj = dict[str, Any]


def render(overlay: str) -> list[Obj]:
    path = DEPLOY / "k8s" / "overlays" / overlay
    done = subprocess.run([tool("kubectl"), "kustomize", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def objs(request: pytest.FixtureRequest) -> list[Obj]:
    return render(request.param)


@pytest.fixture(scope="module")
def ingress() -> list[Obj]:
    return render("ingress")


@pytest.fixture(scope="module")
def sidecar() -> list[Obj]:
    return render("sidecar")


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod(deployment: Obj) -> Obj:
    return deployment["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(deployment: Obj) -> Obj:
    containers = pod(deployment)["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def gateway_config(objs: list[Obj]) -> config.Config:
    data = one(objs, "ConfigMap")["data"]["config.yaml"]
    return config.Config.model_validate(yaml.safe_load(data))


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --- schemas -------------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates(objs: list[Obj], version: str) -> None:
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} against {version}: {exc}")


def test_validation_is_real(ingress: list[Obj]) -> None:
    """The validator rejects a misspelt field and a wrong type in our own Deployment."""
    misspelt = copy.deepcopy(one(ingress, "Deployment", "gateway"))
    container(misspelt)["readinesProbe"] = {}
    mistyped = copy.deepcopy(one(ingress, "Deployment", "gateway"))
    pod(mistyped)["terminationGracePeriodSeconds"] = "fifty"
    for bad in (misspelt, mistyped):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def test_ingress_objects(ingress: list[Obj]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in ingress
                   if o["kind"] != "ConfigMap")
    assert kinds == [("Deployment", "gateway"), ("Deployment", "vllm-worker"),
                     ("HorizontalPodAutoscaler", "gateway"),
                     ("PodDisruptionBudget", "gateway"), ("PodDisruptionBudget", "vllm-worker"),
                     ("Service", "gateway"), ("Service", "vllm-workers")]


def test_sidecar_objects(sidecar: list[Obj]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in sidecar
                   if o["kind"] != "ConfigMap")
    assert kinds == [("Deployment", "gateway"), ("PodDisruptionBudget", "gateway"),
                     ("Service", "gateway")]


# --- wiring --------------------------------------------------------------------------------

def test_services_and_budgets_select_pods_with_named_ports(objs: list[Obj]) -> None:
    deployments = find(objs, "Deployment")
    for obj in find(objs, "Service") + find(objs, "PodDisruptionBudget"):
        spec = obj["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        chosen = [d for d in deployments
                  if selects(selector, d["spec"]["template"]["metadata"]["labels"])]
        assert len(chosen) == 1, f"{obj['kind']}/{obj['metadata']['name']} selects {chosen}"
        ports = {p["name"] for p in container(chosen[0])["ports"]}
        for port in spec.get("ports", []):
            assert port["targetPort"] in ports


def test_deployment_selectors_match_their_pods(objs: list[Obj]) -> None:
    for d in find(objs, "Deployment"):
        assert selects(d["spec"]["selector"]["matchLabels"],
                       d["spec"]["template"]["metadata"]["labels"])


def test_config_map_is_mounted_and_valid(objs: list[Obj]) -> None:
    """The generated (hash-named) ConfigMap is the one the gateway mounts, and what it
    carries passes `gateway check-config`."""
    cm = one(objs, "ConfigMap")
    volumes = {v["name"]: v for v in pod(one(objs, "Deployment", "gateway"))["volumes"]}
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]
    mount = next(m for m in container(one(objs, "Deployment", "gateway"))["volumeMounts"]
                 if m["name"] == "config")
    assert container(one(objs, "Deployment", "gateway"))["args"] == [
        "serve", "--config", f"{mount['mountPath']}/config.yaml"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(cm["data"]["config.yaml"])
        done = check_config(path)
    assert done.returncode == 0, done.stderr


def test_probes_and_hooks_name_declared_ports(objs: list[Obj]) -> None:
    """A probe on an undeclared port name passes every schema and fails on every node."""
    for d in find(objs, "Deployment"):
        c = container(d)
        ports = {p["name"] for p in c["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in c:
                assert c[probe]["httpGet"]["port"] in ports, f"{d['metadata']['name']} {probe}"
        assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"


def test_gateway_probes_and_port(objs: list[Obj]) -> None:
    gw = container(one(objs, "Deployment", "gateway"))
    assert {p["name"]: p["containerPort"] for p in gw["ports"]} == {
        "http": gateway_config(objs).server.port}
    # Neither needs an API key (SPEC.md server.api_keys); /v1/models would answer 401.
    # Readiness follows the workers (/health); liveness the gateway alone (/metrics), so that
    # workers down for a while do not restart the gateways in front of them, except in the
    # sidecar, whose one worker is in the pod (test_sidecar_probes_allow_for_loading).
    assert gw["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    sidecar = any(w.kind == "vllm" for w in gateway_config(objs).workers)
    assert gw["livenessProbe"]["httpGet"] == {"path": "/health" if sidecar else "/metrics",
                                              "port": "http"}


def test_termination_grace_covers_drain(objs: list[Obj]) -> None:
    """Grace > preStop sleep + server.drain_seconds (+ the stop of managed workers): the
    kubelet's SIGKILL must not cut streams the gateway is still draining."""
    cfg = gateway_config(objs)
    spec = pod(one(objs, "Deployment", "gateway"))
    sleep = container(one(objs, "Deployment", "gateway"))["lifecycle"]["preStop"]["exec"]
    assert sleep["command"][0] == "sleep"
    worker_stop = inspect.signature(supervisor.Supervisor.stop).parameters["grace"].default
    needed = float(sleep["command"][1]) + cfg.server.drain_seconds
    needed += worker_stop if cfg.workers else 0
    assert spec["terminationGracePeriodSeconds"] > needed


def test_hardened_gateway_pod(objs: list[Obj]) -> None:
    spec = pod(one(objs, "Deployment", "gateway"))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001  # the images' USER
    ctx = container(one(objs, "Deployment", "gateway"))["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]


def test_images_are_pinned(objs: list[Obj]) -> None:
    for d in find(objs, "Deployment"):
        image = container(d)["image"]
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and "/" not in tag, image


# --- ingress topology ----------------------------------------------------------------------

def test_hpa_scales_the_gateway_on_cpu(ingress: list[Obj]) -> None:
    hpa = one(ingress, "HorizontalPodAutoscaler")["spec"]
    target = one(ingress, hpa["scaleTargetRef"]["kind"], hpa["scaleTargetRef"]["name"])
    assert target["metadata"]["name"] == "gateway"
    assert hpa["minReplicas"] >= 2
    assert "replicas" not in target["spec"]  # the HPA owns it; apply must not reset it
    assert [m["resource"]["name"] for m in hpa["metrics"]] == ["cpu"]
    assert container(target)["resources"]["requests"]["cpu"]  # utilisation is of the request
    assert target["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_upstreams_are_the_headless_worker_service(ingress: list[Obj]) -> None:
    """The gateway's upstream names the headless Service, on its port; the Service selects
    the worker pods, which serve the configured upstream model with `vllm serve`."""
    model = gateway_config(ingress).models[0]
    assert len(model.upstreams) == 1
    url = urlsplit(model.upstreams[0])
    service = one(ingress, "Service", (url.hostname or "").split(".")[0])
    assert service["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in service["spec"]["ports"]] == [url.port]
    workers = [d for d in find(ingress, "Deployment")
               if selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
    assert [w["metadata"]["name"] for w in workers] == ["vllm-worker"]
    vllm = container(workers[0])
    assert vllm["command"] == ["vllm", "serve"]
    assert vllm["args"][0] == model.upstream_model
    assert f"--port={url.port}" in vllm["args"]
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"


def test_workers_have_gpus_and_time_to_load(ingress: list[Obj]) -> None:
    worker = one(ingress, "Deployment", "vllm-worker")
    res = container(worker)["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == 1
    startup = container(worker)["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    grace = pod(worker)["terminationGracePeriodSeconds"]
    assert grace > float(container(worker)["lifecycle"]["preStop"]["exec"]["command"][1])


# --- sidecar topology ----------------------------------------------------------------------

def test_sidecar_pod_runs_the_worker_image_with_a_managed_vllm(sidecar: list[Obj]) -> None:
    cfg = gateway_config(sidecar)
    assert [(w.kind, w.host) for w in cfg.workers] == [("vllm", "127.0.0.1")]
    gw = container(one(sidecar, "Deployment", "gateway"))
    assert gw["image"].split("/")[-1].startswith("inference-gateway-vllm:")
    assert gw["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_sidecar_probes_allow_for_loading(sidecar: list[Obj]) -> None:
    """The startup probe outlasts the supervisor's own startup_timeout, so the gateway gets
    to restart a stuck vLLM before the kubelet restarts the container."""
    cfg = gateway_config(sidecar)
    gw = container(one(sidecar, "Deployment", "gateway"))
    startup = gw["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget > max(w.startup_timeout for w in cfg.workers)
    live = gw["livenessProbe"]
    assert live["httpGet"]["path"] == "/health"  # its one worker is in the pod
    assert live["periodSeconds"] * live["failureThreshold"] >= 300


def test_sidecar_liveness_lets_a_restarted_vllm_finish_loading(sidecar: list[Obj]) -> None:
    """After a vLLM crash the gateway starts it again and /health is 503 while it reloads the
    weights, for up to the worker's `startup_timeout` (vLLM listens only once loaded:
    vllm/entrypoints/openai/api_server.py setup_server). The liveness probe on /health gave
    10 minutes (60 x 10 s) against a startup_timeout of 20: a reload past 10 minutes was
    killed by the kubelet midway and began again in a new container. Its window now
    outlasts startup_timeout, so the gateway's own restart (of a load stuck past it) comes
    first; and also a worker that runs but fails its probe, restarted by the gateway after
    `unhealthy_timeout` out of rotation (/health 503 from then on) and reloaded."""
    cfg = gateway_config(sidecar)
    live = container(one(sidecar, "Deployment", "gateway"))["livenessProbe"]
    window = live["periodSeconds"] * live["failureThreshold"]
    assert window > max(w.startup_timeout for w in cfg.workers)
    assert all(w.unhealthy_timeout for w in cfg.workers)
    assert window > max(w.unhealthy_timeout + w.startup_timeout for w in cfg.workers)
