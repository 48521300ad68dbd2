"""The monitoring components: the ServiceMonitor reaches the gateway pods' /metrics, the Grafana
dashboard ships as a sidecar-labelled ConfigMap, and the HPA scales on the gateway's real
in-flight gauge. (The dashboard's queries against a real scrape: tests/integration/
test_observability.py.)"""

from __future__ import annotations

import json

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from gateway import metrics
from tests.deploy import DEPLOY
from tests.deploy.test_manifests import VERSIONS, Obj, find, one, render, selects

DASHBOARD = DEPLOY / "k8s" / "components" / "monitoring" / "gateway-dashboard.json"


@pytest.fixture(scope="module")
def monitored() -> list[Obj]:
    return render("ingress-monitored")


@pytest.mark.parametrize("version", VERSIONS)
def test_core_objects_validate(monitored: list[Obj], version: str) -> None:
    """Everything but the Prometheus Operator's CRD kinds, against the Kubernetes schemas."""
    for obj in monitored:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kubernetes_validate.validate(obj, version, strict=True)


def test_service_monitor_scrapes_the_gateway_service(monitored: list[Obj]) -> None:
    sm = one(monitored, "ServiceMonitor", "gateway")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    selector = sm["spec"]["selector"]["matchLabels"]
    chosen = [s for s in find(monitored, "Service") if selects(selector, s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in chosen] == ["gateway"]  # not the vLLM workers
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in chosen[0]["spec"]["ports"]}
    assert _seconds(endpoint["scrapeTimeout"]) <= _seconds(endpoint["interval"])


def _seconds(text: str) -> float:
    return float(text.rstrip("s"))


def test_dashboard_ships_as_a_grafana_sidecar_config_map(monitored: list[Obj]) -> None:
    cm = one(monitored, "ConfigMap", "gateway-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["gateway-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_has_the_panels_operators_need() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dash["panels"]}
    wanted = {
        "Time to first token (streams)": "gen_ai_server_time_to_first_token_seconds_bucket",
        "Time per output token (streams)": "gen_ai_server_time_per_output_token_seconds_bucket",
        "Tokens per second": "gen_ai_client_token_usage_sum",
        "Requests in flight": "gateway_requests_in_flight",
        "Errors by type": "error_type",
        "Upstream health": "gateway_upstream_healthy",
    }
    for title, needle in wanted.items():
        assert needle in exprs[title], title
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_hpa_scales_on_the_exported_in_flight_gauge(monitored: list[Obj]) -> None:
    hpa = one(monitored, "HorizontalPodAutoscaler", "gateway")
    by_type = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert by_type["Resource"]["resource"]["name"] == "cpu"  # the base's CPU target stays
    pods = by_type["Pods"]["pods"]
    (family,) = metrics.IN_FLIGHT.describe()
    assert pods["metric"]["name"] == family.name == "gateway_requests_in_flight"
    assert pods["target"]["type"] == "AverageValue"


def test_readme_examples_name_the_real_metric() -> None:
    readme = (DEPLOY / "README.md").read_text()
    assert "name: gateway_requests_in_flight" in readme
    assert "seriesQuery: 'gateway_requests_in_flight" in readme
