"""/metrics after streams, whole answers, failures, failovers and ejections: the OpenTelemetry
GenAI names (semantic-conventions docs/gen-ai/gen-ai-metrics.md) in Prometheus form, their
labels, the spec's advised bucket bounds, the values; and label sets bounded by the config."""

from __future__ import annotations

import asyncio
import random
import string
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import respx
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import parser
from structlog.testing import capture_logs

from gateway import app as gateway_app
from gateway import config, metrics, upstream, upstream_clients
from tests.unit import test_pipeline_respx as harness
from tests.unit.test_failover_respx import REST, TWO_CHOICES_HEAD
from tests.unit.test_pipeline_respx import CHAT, UP1, UP2, make_config

STREAM_USAGE = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"content":"lo!"},"finish_reason":"length"}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}\n\n'
    b"data: [DONE]\n\n")
GENAI = {"gen_ai_operation_name": "chat", "gen_ai_request_model": "demo",
         "gen_ai_provider_name": "vllm"}
ROUTE = {"http_route": "/v1/chat/completions"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in parser.text_string_to_metric_families(text) for s in fam.samples}


def value(s: Samples, name: str, **labels: str) -> float:
    return s.get((name, frozenset(labels.items())), 0.0)


class Scraper:
    """The gateway in process, its workers mocked with respx; /metrics before and after."""

    def __init__(self, router: respx.MockRouter, cfg: config.Config | None = None):
        def factory(_: config.Config) -> upstream.UpstreamClient:
            return upstream_clients.HttpxClient(httpx.AsyncClient(transport=httpx.MockTransport(
                router.async_handler)))

        self.app = gateway_app.build_app(cfg or make_config(), factory)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                        base_url="http://gw")

    async def scrape(self) -> Samples:
        resp = await self.client.get("/metrics")
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/plain; version=")
        return samples(resp.text)


async def run(router: respx.MockRouter, *bodies: dict[str, Any], path: str =
              "/v1/chat/completions") -> tuple[Samples, Samples, list[httpx.Response]]:
    s = Scraper(router)
    async with s.app.router.lifespan_context(s.app), s.client:
        before = await s.scrape()
        answers = [await s.client.post(path, content=orjson.dumps(b)) for b in bodies]
        after = await s.scrape()
    return before, after, answers


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.mark.anyio
async def test_a_stream_records_request_ttft_tpot_tokens_and_its_attempt() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(url__startswith="http://up").mock(return_value=httpx.Response(
            200, content=STREAM_USAGE, headers={"content-type": "text/event-stream"}))
        b, a, (resp,) = await run(r, {**CHAT, "stream": True})
    assert resp.status_code == 200
    req = {**GENAI, **ROUTE, "http_status_class": "2xx", "error_type": ""}
    assert delta(b, a, "gen_ai_server_request_duration_seconds_count", **req) == 1
    assert delta(b, a, "gen_ai_server_request_duration_seconds_bucket", le="+Inf", **req) == 1
    assert delta(b, a, "gen_ai_server_time_to_first_token_seconds_count", **GENAI) == 1
    assert delta(b, a, "gen_ai_server_time_per_output_token_seconds_count", **GENAI) == 1
    tokens = "gen_ai_client_token_usage"
    assert delta(b, a, f"{tokens}_sum", gen_ai_token_type="input", **GENAI) == 7
    assert delta(b, a, f"{tokens}_sum", gen_ai_token_type="output", **GENAI) == 3
    # 3 output tokens: in the bucket le=4, not in le=1
    assert delta(b, a, f"{tokens}_bucket", gen_ai_token_type="output", le="4.0", **GENAI) == 1
    assert delta(b, a, f"{tokens}_bucket", gen_ai_token_type="output", le="1.0", **GENAI) == 0
    hosts = [h for h in ("up1", "up2") if delta(
        b, a, "gen_ai_client_operation_duration_seconds_count", server_address=h,
        server_port="8000", error_type="", **GENAI)]
    assert len(hosts) == 1
    url = f"http://{hosts[0]}:8000"
    assert delta(b, a, "gateway_upstream_attempts_total", gen_ai_request_model="demo",
                 upstream=url, error_type="") == 1
    assert value(a, "gateway_requests_in_flight", gen_ai_request_model="demo") == 0
    assert delta(b, a, "gateway_requests_total", gen_ai_request_model="demo",
                 **ROUTE, http_status_class="2xx") == 1
    errors = [k for k in a if k[0] == "gateway_request_errors_total"]
    assert sum(a[k] - b.get(k, 0.0) for k in errors) == 0  # a success is no error


@pytest.mark.anyio
async def test_a_whole_answer_has_no_time_to_first_token() -> None:
    """gen_ai.server.time_to_first_token is for streams: a whole answer's would be its
    whole latency."""
    with respx.mock(assert_all_called=False) as r:
        r.post(url__startswith="http://up").mock(side_effect=harness.worker_ok)
        b, a, (resp,) = await run(r, CHAT)
    assert resp.status_code == 200
    req = {**GENAI, **ROUTE, "http_status_class": "2xx", "error_type": ""}
    assert delta(b, a, "gen_ai_server_request_duration_seconds_count", **req) == 1
    assert delta(b, a, "gen_ai_server_time_to_first_token_seconds_count", **GENAI) == 0
    assert delta(b, a, "gen_ai_server_time_per_output_token_seconds_count", **GENAI) == 0
    assert delta(b, a, "gen_ai_client_token_usage_sum", gen_ai_token_type="output", **GENAI) == 1


@pytest.mark.anyio
async def test_failures_count_attempts_retries_and_error_types() -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(url__startswith="http://up").mock(side_effect=httpx.ConnectError("refused"))
        b, a, answers = await run(r, {**CHAT, "stream": True}, {**CHAT, "model": "nope"})
    assert [x.status_code for x in answers] == [503, 404]
    failed = {**GENAI, **ROUTE, "http_status_class": "5xx", "error_type": "UpstreamUnavailable"}
    assert delta(b, a, "gen_ai_server_request_duration_seconds_count", **failed) == 1
    assert delta(b, a, "gen_ai_server_time_to_first_token_seconds_count", **GENAI) == 0
    # refused before routing: the required labels say `_OTHER` (gen-ai-metrics.md), not ""
    unknown = {"gen_ai_operation_name": "_OTHER", "gen_ai_request_model": "unknown",
               "gen_ai_provider_name": "_OTHER", **ROUTE, "http_status_class": "4xx",
               "error_type": "ModelNotFound"}
    assert delta(b, a, "gen_ai_server_request_duration_seconds_count", **unknown) == 1
    attempts = sum(delta(b, a, "gateway_upstream_attempts_total", gen_ai_request_model="demo",
                         upstream=u, error_type="UpstreamUnavailable") for u in (UP1, UP2))
    retries = sum(delta(b, a, "gateway_upstream_retries_total", gen_ai_request_model="demo",
                        upstream=u) for u in (UP1, UP2))
    ops = sum(delta(b, a, "gen_ai_client_operation_duration_seconds_count", server_address=h,
                    server_port="8000", error_type="UpstreamUnavailable", **GENAI)
              for h in ("up1", "up2"))
    assert (attempts, retries, ops) == (3, 2, 3)  # one attempt and two bounded retries
    # the same two requests by the counters: one answered 5xx, one refused 4xx, both errors
    assert delta(b, a, "gateway_requests_total", gen_ai_request_model="demo", **ROUTE,
                 http_status_class="5xx") == 1
    assert delta(b, a, "gateway_requests_total", gen_ai_request_model="unknown", **ROUTE,
                 http_status_class="4xx") == 1
    assert delta(b, a, "gateway_request_errors_total", gen_ai_request_model="demo", **ROUTE,
                 error_type="UpstreamUnavailable") == 1
    assert delta(b, a, "gateway_request_errors_total", gen_ai_request_model="unknown", **ROUTE,
                 error_type="ModelNotFound") == 1


@pytest.mark.anyio
async def test_a_failover_is_counted_as_one_and_not_as_a_retry() -> None:
    """gateway_upstream_retries_total: attempts after a failed one before the first byte; a
    stream continued elsewhere after it is a failover (its own counter), not also a retry."""
    from tests.unit.test_failover_respx import HEAD, REST
    with respx.mock(assert_all_called=True) as r:
        harness.healthy(r)  # the other worker passes its probe
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=harness.Broken([HEAD])))
        r.post(f"{UP2}/v1/chat/completions").mock(return_value=httpx.Response(200, content=REST))
        b, a, (resp,) = await run(r, {**CHAT, "stream": True, "max_tokens": 10})
    assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    up = {"gen_ai_request_model": "demo"}
    failovers = sum(delta(b, a, "gateway_upstream_failovers_total", upstream=u, **up)
                    for u in (UP1, UP2))
    retries = sum(delta(b, a, "gateway_upstream_retries_total", upstream=u, **up)
                  for u in (UP1, UP2))
    assert (failovers, retries) == (1, 0)


@pytest.mark.anyio
async def test_failovers_and_ejections_per_upstream() -> None:
    """The routing code's calls, made directly: counters per upstream, health 1 -> 0 -> 1 as
    the balancer ejects and restores the upstream."""
    with respx.mock(assert_all_called=False) as r:
        harness.healthy(r)
        s = Scraper(r)
        ups = s.app.state.services.router.routes["demo"].upstreams
        async with s.app.router.lifespan_context(s.app), s.client:
            await harness.probed(s.app)
            b = await s.scrape()
            metrics.failover("demo", UP2)
            while not ups.failed(UP1):  # ejected: the listener counts it
                pass
            during = await s.scrape()
            ups.succeeded(UP1)  # restored
            after = await s.scrape()
    up = {"gen_ai_request_model": "demo"}
    assert value(b, "gateway_upstream_healthy", upstream=UP1, **up) == 1
    assert delta(b, during, "gateway_upstream_failovers_total", upstream=UP2, **up) == 1
    assert delta(b, during, "gateway_upstream_ejections_total", upstream=UP1, **up) == 1
    assert value(during, "gateway_upstream_healthy", upstream=UP1, **up) == 0
    assert value(during, "gateway_upstream_healthy", upstream=UP2, **up) == 1
    assert value(after, "gateway_upstream_healthy", upstream=UP1, **up) == 1


@pytest.mark.anyio
async def test_in_flight_gauge_counts_an_open_stream() -> None:
    opened, release = asyncio.Event(), asyncio.Event()

    class Held(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield STREAM_USAGE[:STREAM_USAGE.index(b"\n\n") + 2]
            opened.set()
            await release.wait()
            yield STREAM_USAGE[STREAM_USAGE.index(b"\n\n") + 2:]

    with respx.mock(assert_all_called=False) as r:
        r.post(url__startswith="http://up").mock(side_effect=lambda req: httpx.Response(
            200, stream=Held(), headers={"content-type": "text/event-stream"}))
        s = Scraper(r)
        async with s.app.router.lifespan_context(s.app), s.client:
            task = asyncio.ensure_future(s.client.post(
                "/v1/chat/completions", content=orjson.dumps({**CHAT, "stream": True})))
            await asyncio.wait_for(opened.wait(), 10)
            during = await s.scrape()
            release.set()
            assert (await asyncio.wait_for(task, 10)).status_code == 200
            after = await s.scrape()
    assert value(during, "gateway_requests_in_flight", gen_ai_request_model="demo") == 1
    assert value(after, "gateway_requests_in_flight", gen_ai_request_model="demo") == 0


def test_histograms_use_the_advised_bucket_bounds() -> None:
    """ExplicitBucketBoundaries of the GenAI semantic conventions, metric by metric."""
    advised = {
        "gen_ai_server_request_duration_seconds": [
            0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
            81.92],
        "gen_ai_client_operation_duration_seconds": [
            0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
            81.92],
        "gen_ai_server_time_to_first_token_seconds": [
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
            7.5, 10.0],
        "gen_ai_server_time_per_output_token_seconds": [
            0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5],
        "gen_ai_client_token_usage": [
            1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
            67108864],
    }
    text = metrics.exposition(gateway_app.routing.Router(make_config())).decode()
    seen: dict[str, list[float]] = {}
    for fam in parser.text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == fam.name + "_bucket":
                les = seen.setdefault(fam.name, [])
                le = float(smp.labels["le"])
                if le not in les:
                    les.append(le)
    for name, bounds in advised.items():
        assert seen.get(name) == [*map(float, bounds), float("inf")], name


def _random_name(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits, k=12))


@pytest.mark.anyio
async def test_random_paths_and_model_names_add_no_series() -> None:
    """1,000 requests to random paths and model names: the series count stays put (the issue
    measured one new series per unknown name before: a leak any client could drive)."""
    rng = random.Random(16)

    def one() -> tuple[str, dict[str, Any]]:
        name = _random_name(rng)
        path = rng.choice([f"/{name}", f"/v1/{name}", f"/predictions/{name}",
                           f"/_inference/{name}/_unified", "/v1/chat/completions",
                           "/v1/completions", f"/_inference/completion/{name}"])
        body: dict[str, Any] = {"model": name, "messages": CHAT["messages"], "prompt": "x",
                                "input": "x", "inputs": "x"}
        return path, body

    with respx.mock(assert_all_called=False) as r:
        s = Scraper(r)
        async with s.app.router.lifespan_context(s.app), s.client:
            for _ in range(100):  # every kind of path once at least: their series exist now
                path, body = one()
                await s.client.post(path, content=orjson.dumps(body))
            before = await s.scrape()
            statuses: set[int] = set()
            for _ in range(1000):
                path, body = one()
                statuses.add((await s.client.post(path, content=orjson.dumps(body))).status_code)
            after = await s.scrape()
    assert 404 in statuses
    assert set(before) == set(after), set(after) ^ set(before)
    moved = [k for k in after if after[k] != before[k]]  # the registry is process-wide
    models = {dict(k[1]).get("gen_ai_request_model") for k in moved} - {None}
    routes = {dict(k[1]).get("http_route") for k in moved} - {None}
    assert models == {"unknown"}
    assert all("{" in r or r in ("/v1/chat/completions", "/v1/completions") for r in routes)


def test_gone_upstreams_lose_their_health_series() -> None:
    """A worker pod gone from DNS, a stopped managed worker: no series kept for ever."""
    router = gateway_app.routing.Router(make_config())
    ups = router.routes["demo"].upstreams
    ups.add("http://10.9.9.9:8000")
    first = samples(metrics.exposition(router).decode())
    ups.remove("http://10.9.9.9:8000")
    second = samples(metrics.exposition(router).decode())
    key = {"gen_ai_request_model": "demo", "upstream": "http://10.9.9.9:8000"}
    assert value(first, "gateway_upstream_healthy", **key) == 1
    assert ("gateway_upstream_healthy", frozenset(key.items())) not in second


def test_an_upstream_added_later_has_its_counters_at_zero() -> None:
    """A managed worker or a DNS-found pod is listed after startup: its retry, failover and
    ejection series exist at 0 from its listing, as a static upstream's do from startup, so
    increase() and absent() see them (Prometheus' advice for known label values)."""
    router = gateway_app.routing.Router(make_config())
    metrics.declare(router)
    router.routes["demo"].upstreams.add("http://10.8.8.8:8000")
    got = samples(metrics.exposition(router).decode())
    key = {"gen_ai_request_model": "demo", "upstream": "http://10.8.8.8:8000"}
    for name in ("gateway_upstream_retries_total", "gateway_upstream_failovers_total",
                 "gateway_upstream_ejections_total"):
        assert (name, frozenset(key.items())) in got, name
        assert value(got, name, **key) == 0


def test_process_metrics_are_exported() -> None:
    text = metrics.exposition(gateway_app.routing.Router(make_config())).decode()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert f"\n{name}" in text, name


def test_gone_upstreams_lose_every_series_and_cached_child() -> None:
    """A pod's counters and attempt durations leave the scrape and this process's memory with
    it (pod IPs churn with every rollout and scale-down); a listed upstream keeps its own."""
    router = gateway_app.routing.Router(make_config())
    ups = router.routes["demo"].upstreams
    gone, kept = "http://10.9.9.8:8000", "http://10.9.9.7:8000"
    for url in (gone, kept):
        ups.add(url)
    metrics.exposition(router)
    for url in (gone, kept):
        metrics.attempt("demo", url, "UpstreamUnavailable")
        metrics.retry("demo", url)
        metrics.failover("demo", url)
        metrics.ejected("demo", url)
        host, port = metrics.address(url)
        metrics.child(metrics.OPERATION_DURATION, "chat", "demo", "vllm", host, str(port),
                      "").observe(0.5)
    first = samples(metrics.exposition(router).decode())
    ups.remove(gone)
    second = samples(metrics.exposition(router).decode())

    def series(s: Samples, url: str) -> set[str]:
        host, port = metrics.address(url)
        return {name for name, labels in s
                if ("upstream", url) in labels or {("server_address", host),
                                                    ("server_port", str(port))} <= labels}

    names = {"gateway_upstream_attempts_total", "gateway_upstream_retries_total",
             "gateway_upstream_failovers_total", "gateway_upstream_ejections_total",
             "gateway_upstream_healthy", "gen_ai_client_operation_duration_seconds_count"}
    assert names <= series(first, gone) and names <= series(first, kept)
    assert series(second, gone) == set()
    assert names <= series(second, kept)
    assert not [k for k in metrics._children if gone in k[1] or "10.9.9.8" in k[1]]
    ups.remove(kept)
    metrics.exposition(router)


def test_the_scrape_leaves_out_series_that_outlive_their_upstream() -> None:
    """With several serving processes the samples come from prometheus_client's files, where
    a removed series stays: the scrape filters what it shows by the upstreams listed now."""
    import prometheus_client as prom

    files = prom.CollectorRegistry()  # stands for the merged files
    attempts = prom.Counter("gateway_upstream_attempts", "", ["gen_ai_request_model", "upstream",
                                                              "error_type"], registry=files)
    durations = prom.Histogram("gen_ai_client_operation_duration_seconds", "",
                               ["gen_ai_operation_name", "gen_ai_request_model",
                                "gen_ai_provider_name", "server_address", "server_port",
                                "error_type"], registry=files)
    for host in ("10.0.0.1", "10.0.0.2"):
        attempts.labels("demo", f"http://{host}:8000", "").inc()
        durations.labels("chat", "demo", "vllm", host, "8000", "").observe(0.1)
    shown = prom.CollectorRegistry(auto_describe=False)
    shown.register(metrics._ListedOnly(files, {("demo", "http://10.0.0.1:8000")}))
    text = prom.generate_latest(shown).decode()
    assert "10.0.0.1" in text and "10.0.0.2" not in text
    assert 'gateway_upstream_attempts_total{error_type="",gen_ai_request_model="demo",' \
        'upstream="http://10.0.0.1:8000"} 1.0' in text


def _registry_copy(text_registry: Any) -> Samples:
    import prometheus_client as prom

    return {k: v for k, v in samples(prom.generate_latest(text_registry).decode()).items()
            if not k[0].endswith("_created")}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(metrics.TOKEN_BUCKETS), st.floats(0, 1e8),
                          st.integers(0, 70_000_000).map(float)), max_size=40),
       st.booleans())
def test_a_turns_observations_come_out_as_prometheus_client_would_count_them(
        values: list[float], fallback: bool) -> None:
    """Held per turn and added per bucket (`_Buckets`), or handed over one by one where
    prometheus_client is not as expected (`_Observations`): the same buckets, count and sum
    as `observe` per value, bounds included (a value equal to a bound is in that bucket)."""
    import prometheus_client as prom

    ours, theirs = prom.CollectorRegistry(), prom.CollectorRegistry()
    held = prom.Histogram("h", "", ["k"], buckets=metrics.TOKEN_BUCKETS, registry=ours)
    direct = prom.Histogram("h", "", ["k"], buckets=metrics.TOKEN_BUCKETS, registry=theirs)
    series = held.labels("x")
    direct.labels("x")
    holder = metrics._Observations(series) if fallback else metrics._Buckets(series)

    async def turn() -> None:
        for v in values:
            holder.observe(v)
            direct.labels("x").observe(v)

    asyncio.run(turn())  # the flush is scheduled in the turn and runs before the loop ends
    assert not metrics._dirty
    assert _registry_copy(ours) == pytest.approx(_registry_copy(theirs))


def test_changes_are_held_until_the_end_of_the_turn_and_gauges_net_out() -> None:
    """Nothing reaches prometheus_client until the loop turns; then one update per series:
    a gauge raised and lowered in one turn is not touched, a counter gets the turn's sum."""
    import prometheus_client as prom

    reg = prom.CollectorRegistry()
    gauge = prom.Gauge("g", "", ["k"], registry=reg)
    counter = prom.Counter("c", "", ["k"], registry=reg)

    async def main() -> tuple[Samples, Samples, Samples]:
        g, c = metrics.child(gauge, "a"), metrics.child(counter, "a")
        for _ in range(5):
            g.inc()
            c.inc()
        g.dec(3)
        during = _registry_copy(reg)
        await asyncio.sleep(0)
        after = _registry_copy(reg)
        g.inc()
        g.dec()
        await asyncio.sleep(0)
        return during, after, _registry_copy(reg)

    during, after, netted = asyncio.run(main())
    assert value(during, "g", k="a") == 0 and value(during, "c_total", k="a") == 0
    assert value(after, "g", k="a") == 2 and value(after, "c_total", k="a") == 5
    assert value(netted, "g", k="a") == 2


@pytest.mark.anyio
async def test_an_upstreams_password_reaches_no_label_and_no_log_line() -> None:
    """/metrics stays open when API keys are set (SPEC.md server.api_keys), and log lines go to
    shared collectors: a base URL's `user:pass@` is shown with its password masked, as httpx's
    URL repr masks it (RFC 9110 section 4.2.4: userinfo in http URLs risks exposing it)."""
    cfg = config.Config.model_validate({
        "default_model": "demo",
        "models": [{"name": "demo", "backend": "vllm",
                    "upstreams": ["http://alice:hunter2@up1:8000", "http://bob:s3cr3t@up2:8000"]}]})
    with respx.mock(assert_all_called=False) as r, capture_logs() as logs:
        r.route(host__in=["up1", "up2"]).mock(side_effect=httpx.ConnectError("refused"))
        s = Scraper(r, cfg)
        async with s.app.router.lifespan_context(s.app), s.client:
            for _ in range(4):  # retries, then ejections
                resp = await s.client.post("/v1/chat/completions", content=orjson.dumps(CHAT))
                assert resp.status_code == 503 and b"hunter2" not in resp.content
            text = (await s.client.get("/metrics")).text
    assert "hunter2" not in text and "s3cr3t" not in text
    assert 'upstream="http://alice:***@up1:8000"' in text
    logged = repr(logs)
    assert "hunter2" not in logged and "s3cr3t" not in logged
    assert "alice:***@up1:8000" in logged  # the request lines and ejections still name it


def test_routed_groups_and_child_count_each_change_once() -> None:
    """A routed request's common-case series (`metrics.Routed`: found once per request,
    marked changed once per turn) may be shared by several groups (one model's in-flight
    gauge, one upstream's attempts) and observed through `child` in the same turn: each
    change reaches prometheus_client once, at the turn's end, as `observe` per value would."""
    url = "http://10.7.7.7:8000"
    host, port = metrics.address(url)
    chat = ("chat", "grp", "vllm")
    duration = ("gen_ai_server_request_duration_seconds", {
        "gen_ai_operation_name": "chat", "gen_ai_request_model": "grp",
        "gen_ai_provider_name": "vllm", "http_route": "/v1/chat/completions",
        "http_status_class": "2xx", "error_type": ""})

    def read() -> Samples:
        return _registry_copy(metrics.REGISTRY)

    async def main() -> tuple[Samples, Samples, Samples]:
        a = metrics.routed("/v1/chat/completions", *chat)
        b = metrics.routed("/v1/completions", "text_completion", "grp", "vllm")
        assert metrics.routed("/v1/chat/completions", *chat) is a
        for group in (a, b):
            group.in_flight.add(1.0)
            group.touch()
        metrics.child(metrics.IN_FLIGHT, "grp").inc()
        a.duration.add(0.05)
        metrics.child(metrics.REQUEST_DURATION, *chat, "/v1/chat/completions", "2xx",
                      "").observe(0.3)
        attempts, op = a.upstream(url)
        attempts.add(1.0)
        op.add(0.2)
        a.touch()
        shared, _ = b.upstream(url)
        assert shared is attempts
        shared.add(1.0)
        b.touch()
        metrics.attempt("grp", url, "")
        during = read()
        await asyncio.sleep(0)
        after = read()
        assert not metrics._dirty and not a.dirty and not b.dirty
        assert not any(m.dirty for m in (attempts, op, a.in_flight, a.duration))
        a.in_flight.add(-1.0)
        a.duration.add(0.01)
        a.touch()
        await asyncio.sleep(0)
        return during, after, read()

    during, after, later = asyncio.run(main())
    name, labels = duration
    assert value(during, "gateway_requests_in_flight", gen_ai_request_model="grp") == 0
    assert value(after, "gateway_requests_in_flight", gen_ai_request_model="grp") == 3
    assert value(later, "gateway_requests_in_flight", gen_ai_request_model="grp") == 2
    assert value(after, "gateway_upstream_attempts_total", gen_ai_request_model="grp",
                 upstream=url, error_type="") == 3
    assert value(after, f"{name}_count", **labels) == 2
    assert value(after, f"{name}_sum", **labels) == pytest.approx(0.35)
    assert value(after, f"{name}_bucket", **labels, le="0.08") == 1
    assert value(later, f"{name}_count", **labels) == 3
    assert value(after, "gen_ai_client_operation_duration_seconds_count", **dict(zip(
        (*GENAI, "server_address", "server_port", "error_type"),
        ("chat", "grp", "vllm", host, str(port), "")))) == 1


def test_routed_groups_find_an_upstreams_series_anew_once_it_was_dropped() -> None:
    """An upstream no longer listed loses its series (`_forget`); a group that held them
    looks them up again, so an attempt that ends there later is counted as `child` would."""
    url = "http://10.7.7.8:8000"
    group = metrics.routed("/v1/chat/completions", "chat", "grp2", "vllm")
    old = group.upstream(url)
    metrics._forget({("grp2", url)}, set())
    assert not [k for k in metrics._children if url in k[1]]
    new = group.upstream(url)
    assert new[0] is not old[0] and new[1] is not old[1]
    assert metrics.child(metrics.ATTEMPTS, "grp2", url, "") is new[0]


@pytest.mark.parametrize(("status", "etype"), [(200, ""), (200, "client_closed"),
                                               (502, "UpstreamUnavailable")])
def test_a_routed_request_leaves_flight_however_it_ends(status: int, etype: str) -> None:
    """Routed in one turn, ended in a later one, by the common path (a 2xx, no error) or not:
    the in-flight gauge is back where it was and the request is counted once."""
    from types import SimpleNamespace

    from gateway import exchange, telemetry
    from schemas import canonical

    model = f"leave-{status}-{etype}"
    route = SimpleNamespace(name=model, config=SimpleNamespace(backend="vllm"),
                            upstream_model=model)
    req = canonical.InferenceRequest(model=model, messages=[])

    def flight() -> float:
        return value(_registry_copy(metrics.REGISTRY), "gateway_requests_in_flight",
                     gen_ai_request_model=model)

    async def main() -> tuple[float, float]:
        x = exchange.Exchange("rid", "/v1/chat/completions", 0.0, route="/v1/chat/completions")
        w = telemetry.Watch(None, {}, "/v1/chat/completions")
        w.route(route, req)  # type: ignore[arg-type]
        w.begin("http://10.7.7.9:8000", 1)
        await asyncio.sleep(0)
        during = flight()
        x.status, x.error_type = status, etype
        w.finish(x, 1.0)
        await asyncio.sleep(0)
        return during, flight()

    during, after = asyncio.run(main())
    assert (during, after) == (1.0, 0.0)
    got = _registry_copy(metrics.REGISTRY)
    assert value(got, "gen_ai_server_request_duration_seconds_count", gen_ai_operation_name="chat",
                 gen_ai_request_model=model, gen_ai_provider_name="vllm",
                 http_route="/v1/chat/completions", http_status_class=f"{status // 100}xx",
                 error_type=etype) == 1
    assert value(got, "gateway_upstream_attempts_total", gen_ai_request_model=model,
                 upstream="http://10.7.7.9:8000", error_type=etype) == 1


def test_a_value_kept_otherwise_than_as_a_locked_float_gets_its_own_inc() -> None:
    """One serving process: a turn's change is added to prometheus_client's float itself;
    the multiprocess mode's values (files) are changed by their own `inc`."""
    import prometheus_client as prom

    class Filed:
        def __init__(self) -> None:
            self.got: list[float] = []

        def inc(self, amount: float) -> None:
            self.got.append(amount)

    class Series:
        def __init__(self) -> None:
            self._value = Filed()
            self.got: list[float] = []

        def inc(self, amount: float) -> None:
            self.got.append(amount)

    filed = metrics._Delta(Series())
    filed.add(2.0)
    filed.flush()
    assert filed.value is None and filed.series.got == [2.0]

    counter = prom.Counter("direct", "", ["k"], registry=prom.CollectorRegistry()).labels("a")
    held = metrics._Delta(counter)
    held.add(3.0)
    held.flush()
    assert held.value is not None and counter._value.get() == 3.0
    histogram = prom.Histogram("direct_h", "", ["k"], buckets=(1.0, 2.0),
                               registry=prom.CollectorRegistry()).labels("a")
    buckets = metrics._Buckets(histogram)
    buckets.add(1.5)
    buckets.flush()
    assert buckets.direct
    assert [b.get() for b in histogram._buckets] == [0.0, 1.0, 0.0]
    assert histogram._sum.get() == 1.5


def _attempts(b: Samples, a: Samples, url: str, etype: str) -> tuple[float, float]:
    """`url`'s attempts with error type `etype`: by the counter, by the duration histogram."""
    host = url.split("//")[1].split(":")[0]
    return (delta(b, a, "gateway_upstream_attempts_total", gen_ai_request_model="demo",
                  upstream=url, error_type=etype),
            delta(b, a, "gen_ai_client_operation_duration_seconds_count", server_address=host,
                  server_port="8000", error_type=etype, **GENAI))


async def run_with(cfg: config.Config, router: respx.MockRouter, body: dict[str, Any]
                   ) -> tuple[Samples, Samples, httpx.Response]:
    s = Scraper(router, cfg)
    async with s.app.router.lifespan_context(s.app), s.client:
        await harness.probed(s.app)
        before = await s.scrape()
        answer = await s.client.post("/v1/chat/completions", content=orjson.dumps(body))
        after = await s.scrape()
    return before, after, answer


@pytest.mark.anyio
async def test_each_continuation_of_a_stream_of_two_choices_is_an_attempt_of_its_own() -> None:
    """n=2 cut mid-way: each open choice is continued by a request of its own, at once
    (gateway.failover). Three attempts went upstream, so three are counted (the cut one with
    its error), not the last one begun only: gen_ai.client.operation.duration is per
    operation upstream (semantic-conventions gen-ai-metrics.md)."""
    with respx.mock(assert_all_called=True) as r:
        harness.healthy(r)
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=harness.Broken([TWO_CHOICES_HEAD])))
        cont = r.post(f"{UP2}/v1/chat/completions").mock(
            side_effect=lambda _: httpx.Response(200, content=REST))
        b, a, resp = await run_with(make_config(), r, {**CHAT, "stream": True, "n": 2,
                                                        "max_tokens": 10})
    assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
    assert '"error"' not in resp.text and cont.call_count == 2
    assert _attempts(b, a, UP1, "UpstreamBroken") == (1, 1)
    assert _attempts(b, a, UP2, "") == (2, 2)


@pytest.mark.anyio
async def test_a_whole_answer_cut_and_asked_again_counts_the_cut_attempt() -> None:
    """A whole answer asked as a stream, cut mid-way with no continuation
    (`failover_attempts: 0`), is asked again of the other upstream (gateway.folding): the cut
    attempt is counted as the failure it was, not dropped when the next one begins."""
    cut = harness.SSE_OK.split(b"\n\n")[1] + b"\n\n"
    with respx.mock(assert_all_called=True) as r:
        harness.healthy(r)
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=harness.Broken([cut]), headers={"content-type": "text/event-stream"}))
        r.post(f"{UP2}/v1/chat/completions").mock(side_effect=harness.worker_ok)
        b, a, resp = await run_with(make_config(failover_attempts=0), r, CHAT)
    assert resp.status_code == 200
    assert _attempts(b, a, UP1, "UpstreamBroken") == (1, 1)
    assert _attempts(b, a, UP2, "") == (1, 1)


@pytest.mark.anyio
async def test_a_scrape_gets_its_request_id_as_every_answer_does() -> None:
    """SPEC.md: every request gets an id, `x-request-id` in, echoed out; /metrics is a request
    too (a scraper's or a proxy's id is echoed, and one is made where none came)."""
    with respx.mock(assert_all_called=False) as r:
        s = Scraper(r)
        async with s.app.router.lifespan_context(s.app), s.client:
            given = await s.client.get("/metrics", headers={"x-request-id": "scrape-1"})
            made = await s.client.get("/metrics")
    assert given.status_code == made.status_code == 200
    assert given.headers.get_list("x-request-id") == ["scrape-1"]
    assert len(made.headers.get_list("x-request-id")) == 1 and made.headers["x-request-id"]
