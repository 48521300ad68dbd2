"""Active health checks and load scrapes of a model's upstreams, in the background.

Static and DNS-expanded upstreams are probed on their worker protocol's health route
(`Backend.health_path`: vLLM, trtllm-serve and TGI `/health`, Triton `/v2/health/ready`, any
other OpenAI-compatible server `/v1/models`);
managed workers are probed by their supervisor. A new upstream (at startup, or found in DNS)
is probed at once; until then requests are routed to it (as Envoy does without
`ignore_new_hosts_until_first_hc`), so startup waits on nothing, but /health does not count it
yet (Envoy's PENDING_ACTIVE_HC): a gateway whose upstreams are all dead is never ready.
Later rounds follow every `probe_interval` (plus jitter). For `least_request`, each
worker's queue gauges (`Backend.load_gauges`) are read from its /metrics on another period,
while the model has more than one upstream to choose from. With several serving processes,
what the others decided (gateway.board) is taken on every `board.SYNC_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterable

from adapters import base
from gateway import balancer, board, config, routing, upstream


async def probe(client: upstream.UpstreamClient, ups: balancer.Upstreams, path: str,
                timeout: float, urls: list[str] | None = None) -> None:
    """One pass over the static upstreams (or `urls`); a change of verdict is reported."""
    urls = list(ups.static) if urls is None else urls
    found = await asyncio.gather(*(client.check(u + path, timeout, ups.hosts.get(u))
                                   for u in urls),
                                 return_exceptions=True)  # a client bug is a failed probe
    for url, got in zip(urls, found, strict=True):
        if isinstance(got, BaseException):
            ups.probed(url, False, f"{type(got).__name__}: {got}")
        else:
            status, why = got
            ups.probed(url, status == 200, why or f"GET {path}: HTTP {status}")


def gauge_sum(text: str, names: Iterable[str]) -> float | None:
    """The sum over label sets of the first of `names` found in a Prometheus text exposition
    (format 0.0.4: `name{labels} value [timestamp]`); None when none is there."""
    wanted = tuple(names)
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(wanted):
            continue
        cut = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=len(line))
        name, rest = line[:cut], line[cut:]
        if name not in wanted:
            continue
        if rest.startswith("{"):
            rest = rest[rest.rfind("}") + 1:]
        try:
            found[name] = found.get(name, 0.0) + float(rest.split()[0])
        except (IndexError, ValueError):
            continue
    return next((found[n] for n in wanted if n in found), None)


async def scrape(client: upstream.UpstreamClient, ups: balancer.Upstreams,
                 gauges: base.LoadGauges, timeout: float) -> None:
    """Read every upstream's queue: waiting requests plus the KV cache in use (a full cache
    counts as one more request waiting). A worker that does not answer keeps its last value."""
    async def one(url: str) -> None:
        host = ups.hosts.get(url)
        req = base.UpstreamRequest("GET", url + gauges.path, b"", {"host": host} if host else {})
        try:
            async with asyncio.timeout(timeout):
                resp = await client.send(req)
                try:
                    text = (await resp.read()).decode("utf-8", "replace")
                finally:
                    await resp.aclose()
        except Exception:  # a scrape never breaks routing: no answer keeps the last value
            return
        if resp.status != 200:
            return
        queued = gauge_sum(text, gauges.queued) or 0.0
        cache = gauge_sum(text, gauges.cache) if gauges.cache else None
        ups.loaded(url, queued + (cache or 0.0))

    await asyncio.gather(*(one(u) for u in list(ups.all)))


async def watch(route: routing.Route, client: upstream.UpstreamClient,
                settings: config.HealthConfig) -> None:
    """Probe and scrape one model's upstreams until cancelled: a first round at once, and
    new upstreams (DNS) as soon as they appear."""
    path = route.backend.health_path()
    gauges = route.backend.load_gauges() if route.upstreams.policy == "least_request" else None
    loop = asyncio.get_running_loop()
    pending = asyncio.Event()
    route.upstreams.on_pending = pending.set
    jitter = random.uniform(0, 0.1 * settings.probe_interval)  # keep gateways out of step
    next_probe = loop.time()
    next_scrape = loop.time() + settings.load_interval
    shared = route.upstreams.board is not None
    while True:
        pending.clear()
        now = loop.time()
        route.upstreams.sync()
        if now >= next_probe:
            await probe(client, route.upstreams, path, settings.probe_timeout)
            next_probe, jitter = now + settings.probe_interval + jitter, 0.0
        elif fresh := route.upstreams.pending():
            await probe(client, route.upstreams, path, settings.probe_timeout, fresh)
        if gauges is not None and now >= next_scrape:
            if len(route.upstreams.all) > 1:  # with one upstream there is nothing to choose
                await scrape(client, route.upstreams, gauges, settings.probe_timeout)
            next_scrape = now + settings.load_interval
        due = next_probe if gauges is None else min(next_probe, next_scrape)
        if shared:
            due = min(due, now + board.SYNC_SECONDS)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pending.wait(), max(0.0, due - loop.time()))


def start(routes: Iterable[routing.Route], client: upstream.UpstreamClient,
          settings: config.HealthConfig) -> list[asyncio.Task[None]]:
    """One watcher per model."""
    return [asyncio.ensure_future(watch(r, client, settings)) for r in routes]
