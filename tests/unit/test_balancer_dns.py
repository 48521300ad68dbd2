"""Upstreams named by DNS stand for every address the name resolves to, refreshed live."""

from __future__ import annotations

import pytest

from gateway import balancer, health, resolver


def test_round_robin_starts_on_each_upstream_in_turn() -> None:
    ups = balancer.Upstreams(("http://10.0.0.1:8000", "http://10.0.0.2:8000"))
    assert ups.order() == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert ups.order() == ["http://10.0.0.2:8000", "http://10.0.0.1:8000"]


def test_managed_workers_join_and_leave() -> None:
    ups = balancer.Upstreams()
    ups.add("http://127.0.0.1:9000")
    assert ups.all == ["http://127.0.0.1:9000"]
    ups.remove("http://127.0.0.1:9000")
    assert ups.order() == []


def test_only_http_names_are_resolved() -> None:
    assert balancer.dns_name("http://vllm-workers.ns.svc.cluster.local:8000") == \
        "vllm-workers.ns.svc.cluster.local"
    assert balancer.dns_name("http://10.1.2.3:8000") is None
    assert balancer.dns_name("http://[::1]:8000") is None
    assert balancer.dns_name("https://api.example.com") is None  # TLS needs its name


@pytest.mark.anyio
async def test_headless_service_scales_without_restart() -> None:
    records = {"workers.ns.svc": ["10.0.0.7", "10.0.0.5"]}

    async def find(host: str, port: int) -> list[str]:
        assert port == 8000
        return sorted(records.get(host, []))

    ups = balancer.Upstreams(("http://workers.ns.svc:8000", "http://10.9.9.9:8000"))
    assert ups.all == ["http://workers.ns.svc:8000", "http://10.9.9.9:8000"]
    await resolver.refresh([ups], find)
    assert ups.all == ["http://10.0.0.5:8000", "http://10.0.0.7:8000", "http://10.9.9.9:8000"]
    records["workers.ns.svc"].append("10.0.0.9")  # scaled up
    await resolver.refresh([ups], find)
    assert "http://10.0.0.9:8000" in ups.all and len(ups.all) == 4
    records["workers.ns.svc"] = []  # a failed lookup keeps the last answer
    await resolver.refresh([ups], find)
    assert len(ups.all) == 4
    records["workers.ns.svc"] = ["10.0.0.9"]  # scaled down
    await resolver.refresh([ups], find)
    assert ups.all == ["http://10.0.0.9:8000", "http://10.9.9.9:8000"]


@pytest.mark.anyio
async def test_real_lookup_of_localhost() -> None:
    assert "127.0.0.1" in await resolver.lookup("localhost", 80)
    ups = balancer.Upstreams(("http://localhost:8123",))
    await resolver.refresh([ups])
    assert ups.all == ["http://127.0.0.1:8123"]


def test_an_expanded_name_keeps_its_port_and_credentials() -> None:
    """Each address a DNS-named upstream resolves to is the same worker service: it takes the
    name's userinfo (its Basic credentials, gateway.http1) and port with it."""
    assert resolver.expand("http://u:p@workers:8000", ["10.0.0.1", "fd00::2"]) == [
        "http://u:p@10.0.0.1:8000", "http://u:p@[fd00::2]:8000"]
    assert resolver.expand("http://workers", ["10.0.0.1"]) == ["http://10.0.0.1"]


@pytest.mark.anyio
async def test_an_expanded_address_is_asked_with_its_names_host() -> None:
    """Each address a DNS name expands to is asked with the name as Host (RFC 9110 section
    7.2: Host is the target URI's authority), as nginx's `proxy_pass http://name` and curl's
    `--resolve` send it: a name-based ingress or proxy in front of the workers routes by it,
    and answered every request (and probe) naming the bare address with a 404."""
    async def find(host: str, port: int) -> list[str]:
        return ["10.0.0.5", "fd00::7"] if host == "vllm.internal" else []

    ups = balancer.Upstreams(("http://u:p@vllm.internal:8000", "http://10.9.9.9:8000"))
    await resolver.refresh([ups], find)
    assert ups.hosts == {"http://u:p@10.0.0.5:8000": "vllm.internal:8000",
                         "http://u:p@[fd00::7]:8000": "vllm.internal:8000"}
    seen: list[tuple[str, str | None]] = []

    class Client:
        async def check(self, url: str, timeout: float,
                        host: str | None = None) -> tuple[int, str]:
            seen.append((url, host))
            return 200, ""

    await health.probe(Client(), ups, "/health", 1.0)  # type: ignore[arg-type]
    assert sorted(seen, key=str) == [("http://10.9.9.9:8000/health", None),
                                     ("http://u:p@10.0.0.5:8000/health", "vllm.internal:8000"),
                                     ("http://u:p@[fd00::7]:8000/health", "vllm.internal:8000")]
