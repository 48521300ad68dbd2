"""Retries before the first byte follow the order their request was given when it came, but
pass over upstreams that other requests' failures ejected meanwhile (or whose one half-open
trial is out): an attempt there is either doomed or a second request through a half-open
upstream (SPEC.md, Routing, health and failover: half-open tries again; Envoy's retry host
predicate `previous_hosts` picks the retry's host afresh from the healthy ones)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters import base
from gateway import config, pipeline, routing
from schemas import canonical, errors

pytestmark = pytest.mark.anyio

A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"
DONE = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n")


class Answer:
    status = 200

    def __init__(self) -> None:
        self.parts = [DONE]

    async def read_chunk(self) -> bytes:
        return self.parts.pop(0) if self.parts else b""

    async def read(self) -> bytes:
        return b"".join(self.parts)

    async def aclose(self) -> None:
        return None


class Workers:
    """A refuses each request after `meanwhile` ran (what other requests did during it);
    the rest answer."""

    def __init__(self, meanwhile: Any) -> None:
        self.meanwhile = meanwhile
        self.asked: list[str] = []

    async def send(self, req: base.UpstreamRequest) -> Any:
        url = req.url.rsplit("/v1/", 1)[0]
        self.asked.append(url)
        if url == A:
            self.meanwhile()
            raise errors.UpstreamUnavailable("refused")
        return Answer()

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        return 200, ""

    async def aclose(self) -> None:
        return None


def setup(urls: list[str], retries: int, eject_after: int) -> tuple[routing.Route, config.Config]:
    cfg = config.Config.model_validate({
        "server": {"retries": retries, "health": {"eject_after": eject_after, "backoff": 5}},
        "default_model": "m",
        "models": [{"name": "m", "backend": "vllm", "upstreams": urls,
                    "routing": "round_robin"}]})
    route = routing.Router(cfg).resolve("m")
    for url in urls:
        route.upstreams.probed(url, True)
    return route, cfg


REQ = canonical.InferenceRequest(model="m", messages=[canonical.Message("user", "hi")],
                                 stream=True, sampling=canonical.Sampling(max_tokens=5))


async def test_a_retry_passes_over_an_upstream_ejected_since_its_order_was_made() -> None:
    route, cfg = setup([A, B, C], retries=1, eject_after=1)
    workers = Workers(lambda: route.upstreams.failed(B))  # B fails other requests meanwhile
    flow = pipeline.Pipeline(workers, cfg.server)
    opened = await flow.open(route, REQ, "rid", pipeline.Attempt())
    await opened.close(route.upstreams)
    assert workers.asked == [A, C]


async def test_a_retry_is_no_second_request_through_a_half_open_upstream() -> None:
    route, cfg = setup([A, B], retries=1, eject_after=1)
    ups = route.upstreams
    ups.failed(B)
    ups.clock = lambda: float("inf")  # B's backoff is over: half-open
    trial: list[int] = []
    workers = Workers(lambda: trial or trial.append(ups.begin(B)))  # another takes B's trial
    flow = pipeline.Pipeline(workers, cfg.server)
    with pytest.raises(errors.UpstreamUnavailable):  # A again: its failure is the answer
        await flow.open(route, REQ, "rid", pipeline.Attempt())
    assert workers.asked == [A, A] and ups.health[B].in_flight == 1
