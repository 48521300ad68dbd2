"""Upstream health: passive ejection with growing backoff and half-open trials, active probes
on each worker protocol's health route, /health and readiness telling the truth, and the
workers' queue gauges read for least-request routing."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from adapters import registry
from gateway import balancer, config, health, http1, upstream_clients
from simulator import SimulatorSettings, build_app
from tests.fakes import hosts, tgi_fake, triton_fake, trtllm_fake


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ups_with_clock(n: int = 2, **settings: Any) -> tuple[balancer.Upstreams, Clock]:
    clock = Clock()
    urls = tuple(f"http://10.0.0.{i}:8000" for i in range(1, n + 1))
    cfg = config.HealthConfig(**{"eject_after": 3, "backoff": 1.0, "backoff_max": 8, **settings})
    ups = balancer.Upstreams(urls, "round_robin", cfg, clock)
    for url in urls:  # past their first probe
        ups.probed(url, True)
    return ups, clock


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    ups, _ = ups_with_clock()
    a, b = ups.all
    ups.failed(a)
    ups.failed(a)
    ups.succeeded(a)  # not in a row: no ejection
    ups.failed(a)
    ups.failed(a)
    assert a in ups.healthy()
    assert ups.failed(a) is True
    assert ups.healthy() == [b] and ups.order() == [b]


def test_half_open_lets_one_request_through_and_recovers_on_success() -> None:
    ups, clock = ups_with_clock()
    a, b = ups.all
    for _ in range(3):
        ups.failed(a)
    clock.now += 0.99
    assert a not in ups.healthy()
    clock.now += 0.02  # the backoff is over: half-open
    assert a in ups.healthy()
    ups.begin(a)  # the trial request
    assert ups.healthy() == [b]  # only one trial at a time
    ups.succeeded(a)
    ups.end(a)
    assert ups.healthy() == [a, b]
    ups.failed(a)  # the count starts afresh after recovery
    assert a in ups.healthy()


def test_failed_trials_double_the_backoff_up_to_its_cap() -> None:
    ups, clock = ups_with_clock()
    a = ups.all[0]
    for _ in range(3):
        ups.failed(a)
    lengths = []
    for _ in range(5):
        h = ups.health[a]
        lengths.append(h.backoff)
        clock.now = h.ejected_until
        ups.begin(a)
        ups.failed(a)
        ups.end(a)
    assert lengths == [1.0, 2.0, 4.0, 8.0, 8.0]


def test_an_always_failing_upstream_gets_one_request_per_backoff_window() -> None:
    """Simulated 60 s of steady traffic (one request every 10 ms) with one upstream failing
    every request: after its first `eject_after` failures it sees one trial per window."""
    ups, clock = ups_with_clock(backoff=1.0, backoff_max=4.0)
    bad, good = ups.all
    hits = 0
    for _ in range(6000):
        clock.now += 0.01
        first = ups.order()[0]
        ups.begin(first)
        if first == bad:
            hits += 1
            ups.failed(bad)
        else:
            ups.succeeded(good)
        ups.end(first)
    assert hits <= 3 + 60 / 4 + 3  # the ejections, then a trial per (capped) 4 s window


class Heard(balancer.Quiet):
    """A listener that keeps the ejections and restorations it hears."""

    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []

    def ejected(self, model: str, url: str, backoff: float) -> None:
        self.events.append(("ejected", backoff))

    def restored(self, model: str, url: str) -> None:
        self.events.append(("restored", 0.0))


def test_once_the_backoff_is_over_health_counts_it_and_a_passing_probe_restores_it() -> None:
    """One upstream (a sidecar, /health its readiness probe) ejected once: no request may come
    to try it while it reads as not ready, so the half-open upstream counts for /health and the
    active probe stands for its trial (Envoy ends an ejection when its time is up)."""
    ups, clock = ups_with_clock(1)
    ups.listener = heard = Heard()
    a = ups.all[0]
    for _ in range(3):  # one request and its two retries on the only upstream
        ups.failed(a, ups.begin(a))
    assert ups.in_rotation() == [] and ups.healthy() == []
    clock.now += 1.0
    assert ups.in_rotation() == [a] and ups.healthy() == [a]  # half-open
    ups.probed(a, True)
    assert ups.health[a].ejected_until == 0.0 and ups.health[a].failures == 0
    assert heard.events == [("ejected", 1.0), ("restored", 0.0)]
    for _ in range(3):  # ejected again: no request succeeded since, so for twice as long
        ups.failed(a, ups.begin(a))
    clock.now += 2.0
    ups.probed(a, False)  # a failing probe after the backoff: out again, twice as long
    assert ups.health[a].backoff == 4.0 and ups.in_rotation() == []
    clock.now += 4.0
    ups.probed(a, True)
    ticket = ups.begin(a)
    ups.succeeded(a, ticket)  # a request served: the next ejection starts short again
    ups.end(a, ticket)
    for _ in range(3):
        ups.failed(a, ups.begin(a))
    assert ups.health[a].backoff == 1.0


def test_failures_already_in_flight_at_the_ejection_eject_it_once() -> None:
    """A burst of 20 concurrent requests fails on one upstream: one ejection for the base
    backoff, not one per failure (Envoy does not eject an ejected host); only the half-open
    trial's failure doubles it, whatever older attempts report meanwhile."""
    ups, clock = ups_with_clock()
    ups.listener = heard = Heard()
    a = ups.all[0]
    burst = [ups.begin(a) for _ in range(20)]
    for ticket in burst[:10]:
        ups.failed(a, ticket)
        ups.end(a, ticket)
    assert heard.events == [("ejected", 1.0)]
    clock.now += 1.0
    trial = ups.begin(a)
    assert a not in ups.healthy()  # one trial at a time
    for ticket in burst[10:]:  # the rest of the burst ends during the trial
        ups.failed(a, ticket)
        ups.end(a, ticket)
    assert heard.events == [("ejected", 1.0)] and ups.health[a].trial
    ups.end(a, trial)  # the pipeline ends an attempt before judging it
    assert ups.failed(a, trial) is True
    assert heard.events == [("ejected", 1.0), ("ejected", 2.0)]
    clock.now += 2.0
    trial = ups.begin(a)
    late = ups.begin(a)  # not the trial (all upstreams out, say): its failure is no verdict
    assert ups.failed(a, late) is False
    ups.succeeded(a, trial)
    assert a in ups.in_rotation() and ups.health[a].failures == 0
    ups.failed(a, late)  # begun before the upstream was restored: judged already
    assert ups.health[a].failures == 0


def test_an_upstream_listed_again_owes_nothing_to_attempts_on_its_earlier_listing() -> None:
    """A managed worker taken out (its probes failed) while requests ran on it, then gated in
    again once it recovered (or an address gone from DNS and back): those requests' ends and
    failures belong to the earlier listing. Counted on the new one, they ejected a worker that
    served every request since, and their ends took the new requests' places in its in-flight
    count (least_request then sent it more than its share)."""
    ups, _ = ups_with_clock(1)
    w = "http://127.0.0.1:8101"
    ups.add(w)
    old = [ups.begin(w) for _ in range(3)]
    ups.remove(w)
    ups.add(w)
    new = [ups.begin(w) for _ in range(2)]
    for ticket in old:
        ups.end(w, ticket)
        ups.failed(w, ticket)
    assert ups.health[w].in_flight == 2 and ups.health[w].failures == 0
    assert w in ups.healthy() and w in ups.in_service()
    for ticket in new:
        ups.succeeded(w, ticket)
        ups.end(w, ticket)
    assert ups.health[w].in_flight == 0

    dns = balancer.Upstreams(("http://workers:8000",), "round_robin",
                             config.HealthConfig(eject_after=1))
    a, b = "http://10.1.0.1:8000", "http://10.1.0.2:8000"
    dns.resolved("http://workers:8000", [a, b])
    ticket = dns.begin(a)
    dns.resolved("http://workers:8000", [b])
    dns.resolved("http://workers:8000", [a, b])  # back, probed afresh
    dns.probed(a, True)
    assert dns.failed(a, ticket) is False and a in dns.healthy()


def test_a_4xx_never_counts_toward_ejection() -> None:
    """Through the pipeline: a worker answering 400 stays in rotation; one refusing
    connections is ejected after three tries and then costs requests nothing."""
    cfg = config.Config.model_validate({
        "server": {"retries": 1, "health": {"eject_after": 3, "backoff": 60}},
        "models": [{"name": "m", "routing": "round_robin",
                    "upstreams": ["http://bad:8000", "http://fussy:8000", "http://ok:8000"]}]})
    sim = build_app(SimulatorSettings(tokens=2))
    calls: dict[str, int] = {"bad": 0, "fussy": 0}

    async def fussy(request: Request) -> Response:
        calls["fussy"] += 1
        return Response(b'{"error":{"message":"no"}}', 400)

    class Refusing:
        """Its probe passes (passive ejection is the point here); its requests are refused."""

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["path"] == "/health":
                await Response(b"")(scope, receive, send)
                return
            calls["bad"] += 1
            raise httpx.ConnectError("refused")

    fakes = {"bad": Refusing(), "ok": sim,
             "fussy": Starlette(routes=[Route("/v1/completions", fussy, methods=["POST"]),
                                        Route("/health", lambda r: Response(b""))])}

    async def go() -> tuple[list[int], str]:
        async with hosts.serve(cfg, fakes) as gw:
            got = [(await gw.post("/v1/completions", json={"model": "m", "prompt": "x"}))
                   .status_code for _ in range(12)]
            return got, (await gw.get("/metrics")).text

    statuses, metrics = asyncio.run(go())
    ejected = {line.split('upstream="')[1].split('"')[0] for line in metrics.splitlines()
               if line.startswith("gateway_upstream_ejections_total{")
               and not line.endswith(" 0.0")}  # counted through gateway.hooks
    assert "http://bad:8000" in ejected and "http://fussy:8000" not in ejected
    assert calls["bad"] == 3  # ejected after its third failure, never tried again
    assert calls["fussy"] == statuses.count(400) >= 6  # its 400s in a row never ejected it
    assert statuses[-4:].count(400) == 2 and set(statuses) == {200, 400}


@pytest.mark.parametrize(("kind", "fake"), [
    ("vllm", lambda: build_app(SimulatorSettings())), ("trtllm", trtllm_fake.app),
    ("tgi", tgi_fake.app), ("triton", triton_fake.app)])
def test_probes_use_each_worker_protocols_health_route(kind: str, fake: Any) -> None:
    down = Starlette(routes=[Route(registry.backend(kind).health_path(),
                                   lambda r: Response(b"", 503), methods=["GET"])])
    ups = balancer.Upstreams(("http://w:1", "http://down:1"))
    client = upstream_clients.HttpxClient(httpx.AsyncClient(transport=hosts.Hosts(
        {"w": fake(), "down": down})))

    async def go() -> None:
        await health.probe(client, ups, registry.backend(kind).health_path(), 2.0)
        await client.aclose()

    asyncio.run(go())
    assert ups.healthy() == ["http://w:1"]


def test_a_worker_found_down_is_logged_with_why() -> None:
    """A probe that fails said only `healthy: false`: an https worker whose certificate is
    not trusted, a refused port or a base URL whose health route is a 404 all looked alike,
    and requests then failed with "no healthy upstream". The reason is now in the line."""
    changes: list[tuple[str, bool, str]] = []

    class Listener(balancer.Quiet):
        def probe_changed(self, model: str, url: str, ok: bool, why: str = "") -> None:
            changes.append((url, ok, why))

    async def go() -> None:
        async def not_found(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await w.drain()
            w.close()

        server = await asyncio.start_server(not_found, "127.0.0.1", 0)
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))  # bound, never listening: refused
            urls = (f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}",
                    f"http://127.0.0.1:{closed.getsockname()[1]}")
            ups = balancer.Upstreams(urls, listener=Listener())
            client = http1.Http1Client(2.0)
            await health.probe(client, ups, "/health", 2.0)
            await client.aclose()
        server.close()

    asyncio.run(go())
    (_, ok_a, why_a), (_, ok_b, why_b) = changes
    assert (ok_a, why_a, ok_b) == (False, "GET /health: HTTP 404", False)
    assert why_b.startswith("ConnectionRefusedError: ")


def health_worker(state: dict[str, int]) -> Starlette:
    """A worker whose /health answers `state["status"]`."""
    async def probe(request: Request) -> Response:
        return Response(b"", state["status"])

    return Starlette(routes=[Route("/health", probe, methods=["GET"])])


def test_health_readiness_and_gauge_tell_the_truth_with_every_upstream_down() -> None:
    state = {"status": 200}
    worker = health_worker(state)
    cfg = config.Config.model_validate({
        "server": {"health": {"probe_interval": 0.02}},
        "models": [{"name": "m", "upstreams": ["http://a:1", "http://b:1"]}]})

    async def until(gw: httpx.AsyncClient, status: int) -> tuple[int, int, list[str]]:
        for _ in range(200):
            health_ = await gw.get("/health")
            if health_.status_code == status:
                break
            await asyncio.sleep(0.01)
        ping = await gw.get("/ping")
        metrics = (await gw.get("/metrics")).text
        gauges = sorted(line.rsplit(" ", 1)[1] for line in metrics.splitlines()
                        if line.startswith('gateway_upstream_healthy{gen_ai_request_model="m"'))
        return health_.status_code, ping.status_code, gauges

    async def go() -> list[tuple[int, int, list[str]]]:
        async with hosts.serve(cfg, {"a": worker, "b": worker}) as gw:
            up = await until(gw, 200)
            state["status"] = 503
            down = await until(gw, 503)
            fail = await gw.post("/v1/completions", json={"model": "m", "prompt": "x"})
            assert fail.status_code == 503
            state["status"] = 200
            return [up, down, await until(gw, 200)]

    up, down, back = asyncio.run(go())
    assert up == (200, 200, ["1.0", "1.0"])
    assert down == (503, 503, ["0.0", "0.0"])
    assert back == up


def test_gauges_are_summed_over_label_sets_first_name_found() -> None:
    text = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a b}"} 2.0
vllm:num_requests_waiting{engine="1",model_name="x"} 3 1700000000
vllm:num_requests_waiting_total 99
tgi_queue_size 4
"""
    assert health.gauge_sum(text, ("vllm:num_requests_waiting",)) == 5.0
    assert health.gauge_sum(text, ("tgi_queue_size",)) == 4.0
    assert health.gauge_sum(text, ("nope", "tgi_queue_size")) == 4.0
    assert health.gauge_sum(text, ("nope",)) is None


def test_scraped_queue_steers_least_request() -> None:
    sims = {"a": build_app(SimulatorSettings(max_batch=1)), "b": build_app(SimulatorSettings())}
    ups = balancer.Upstreams(("http://a:1", "http://b:1"), "least_request")
    sims["a"].engine.waiting = 5  # a queue behind its one slot
    client = upstream_clients.HttpxClient(httpx.AsyncClient(transport=hosts.Hosts(sims)))
    gauges = registry.backend("vllm").load_gauges()
    assert gauges is not None

    async def go() -> None:
        await health.scrape(client, ups, gauges, 2.0)
        await client.aclose()

    asyncio.run(go())
    assert ups.health["http://a:1"].queued == 5.0
    assert all(ups.order()[0] == "http://b:1" for _ in range(20))


def test_dns_expanded_addresses_are_the_ones_probed_and_managed_workers_are_not() -> None:
    ups = balancer.Upstreams(("http://workers.ns.svc:8000",))
    ups.resolved("http://workers.ns.svc:8000", ["http://10.1.0.1:8000", "http://10.1.0.2:8000"])
    ups.add("http://127.0.0.1:9000")  # a managed worker: its supervisor probes it
    assert ups.static == ["http://10.1.0.1:8000", "http://10.1.0.2:8000"]
    seen: list[str] = []

    class Client:
        async def check(self, url: str, timeout: float,
                        host: str | None = None) -> tuple[int, str]:
            seen.append(url)
            return (503 if "10.1.0.2" in url else 200), ""

    asyncio.run(health.probe(Client(), ups, "/health", 1.0))  # type: ignore[arg-type]
    assert sorted(seen) == ["http://10.1.0.1:8000/health", "http://10.1.0.2:8000/health"]
    assert ups.healthy() == ["http://10.1.0.1:8000", "http://127.0.0.1:9000"]


def test_routing_and_failover_keys_default_as_the_spec_says() -> None:
    cfg = config.Config.model_validate({"models": [{"name": "m"}]})
    assert cfg.models[0].routing == "least_request"
    assert cfg.server.failover_attempts == 1
    with pytest.raises(ValueError, match="routing"):
        config.Config.model_validate({"models": [{"name": "m", "routing": "random"}]})


def test_health_waits_for_the_first_probe_which_runs_at_once() -> None:
    """Envoy holds actively checked hosts PENDING until their first check: a gateway whose
    only upstream is dead never reads ready, and one whose upstream lives is ready after one
    probe (run at start, not one `probe_interval` later); requests are routed meanwhile."""
    state = {"status": 503}
    worker = health_worker(state)
    cfg = config.Config.model_validate({
        "server": {"health": {"probe_interval": 60}},
        "models": [{"name": "m", "upstreams": ["http://a:1"]}]})

    async def answers(live: bool) -> list[int]:
        state["status"] = 200 if live else 503
        async with hosts.serve(cfg, {"a": worker}) as gw:
            seen = []
            for _ in range(50):  # bounded: 0.5 s, against a 60 s probe interval
                seen.append((await gw.get("/health")).status_code)
                await asyncio.sleep(0.01)
            return seen

    assert set(asyncio.run(answers(False))) == {503}
    live = asyncio.run(answers(True))
    assert live[-1] == 200 and set(live) <= {200, 503}
    ups = balancer.Upstreams(("http://a:1",))
    assert ups.healthy() == ["http://a:1"] and ups.in_rotation() == []  # pending: routed to


class WithoutHealthRoute:
    """An OpenAI-compatible server with no `/health` (OpenAI's API has none: a 404 there),
    the simulator's answers otherwise."""

    def __init__(self) -> None:
        self.sim = build_app(SimulatorSettings())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            await Response(b"Not Found", 404)(scope, receive, send)
            return
        await self.sim(scope, receive, send)


def test_an_openai_compatible_server_without_a_health_route_is_in_rotation() -> None:
    """`backend: openai` is any OpenAI-compatible server (SPEC.md); its probe is `GET
    /v1/models`, which the OpenAI API has (API reference, Models: List models), not `/health`,
    which it lacks: a server without one is healthy and serves."""
    cfg = config.Config.model_validate({
        "server": {"health": {"probe_interval": 0.05}},
        "models": [{"name": "m", "backend": "openai", "upstreams": ["http://w:1"]}]})

    async def go() -> tuple[int, int]:
        async with hosts.serve(cfg, {"w": WithoutHealthRoute()}) as gw:
            for _ in range(100):  # past the first probe
                if (await gw.get("/health")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            ready = (await gw.get("/health")).status_code
            answer = await gw.post("/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}]})
            return ready, answer.status_code

    assert asyncio.run(go()) == (200, 200)


def test_an_overloaded_worker_is_tried_elsewhere_but_never_ejected() -> None:
    """TGI answers an overloaded request 429 (router server.rs, InferError::Overloaded): the
    request is retried on another worker, but a 4xx never counts toward ejection (SPEC.md;
    Envoy's consecutive_5xx counts 5xx only), so the overloaded worker stays in rotation and
    keeps being offered requests once it has room again."""
    cfg = config.Config.model_validate({
        "server": {"retries": 1, "health": {"eject_after": 1}},
        "models": [{"name": "m", "backend": "tgi", "routing": "round_robin",
                    "upstreams": ["http://busy:1", "http://ok:1"]}]})
    busy = tgi_fake.app(overloaded=True)

    async def go() -> tuple[list[int], str]:
        async with hosts.serve(cfg, {"busy": busy, "ok": tgi_fake.app()}) as gw:
            got = [(await gw.post("/generate", json={"inputs": "x"})).status_code
                   for _ in range(6)]
            return got, (await gw.get("/metrics")).text

    statuses, text = asyncio.run(go())
    assert statuses == [200] * 6
    assert 'gateway_upstream_ejections_total{gen_ai_request_model="m",upstream="http://busy:1"} 0.0' \
        in text
    assert len(busy.state.requests) >= 3  # still offered requests: never out of rotation
