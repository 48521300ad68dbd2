"""Prometheus metrics for /metrics: requests, errors, time to first token, inter-token
latency, tokens in and out, upstream health. Recorded once per request (never per chunk):
the inter-token latency observed is the request's mean gap between upstream reads."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import prometheus_client as prom
from prometheus_client import multiprocess

if TYPE_CHECKING:
    from gateway.exchange import Exchange
    from gateway.routing import Router

REGISTRY = prom.CollectorRegistry(auto_describe=True)
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

REQUESTS = prom.Counter("gateway_requests", "Requests answered", ["path", "model", "status"],
                        registry=REGISTRY)
ERRORS = prom.Counter("gateway_errors", "Requests that ended in an error, by outcome",
                      ["path", "model", "outcome"], registry=REGISTRY)
TTFT = prom.Histogram("gateway_time_to_first_token_seconds",
                      "From the request's arrival to the worker's first event",
                      ["model"], buckets=_LATENCY, registry=REGISTRY)
ITL = prom.Histogram("gateway_inter_token_latency_seconds",
                     "Mean gap between a stream's upstream reads", ["model"],
                     buckets=_LATENCY, registry=REGISTRY)
TOKENS_IN = prom.Counter("gateway_prompt_tokens", "Prompt tokens", ["model"], registry=REGISTRY)
TOKENS_OUT = prom.Counter("gateway_completion_tokens", "Completion tokens", ["model"],
                          registry=REGISTRY)
UPSTREAMS = prom.Gauge("gateway_upstreams_healthy", "Upstreams in rotation", ["model"],
                       registry=REGISTRY, multiprocess_mode="mostrecent")


def record(x: Exchange, ended: float) -> None:
    """One request's metrics."""
    model = x.model or ""
    REQUESTS.labels(x.path, model, str(x.status)).inc()
    if x.outcome != "ok":
        ERRORS.labels(x.path, model, x.outcome).inc()
    if x.first_event_at is not None:
        TTFT.labels(model).observe(x.first_event_at - x.started)
        if x.reads > 1:
            ITL.labels(model).observe((ended - x.first_event_at) / (x.reads - 1))
    if x.usage is not None:
        TOKENS_IN.labels(model).inc(x.usage.prompt_tokens)
        TOKENS_OUT.labels(model).inc(x.usage.completion_tokens)


def exposition(router: Router) -> bytes:
    for route in router.routes.values():
        UPSTREAMS.labels(route.name).set(len(route.upstreams.all))
    return bytes(prom.generate_latest(collected()))


def collected() -> prom.CollectorRegistry:
    """This process's registry; with several serving processes (`server.workers`), every
    process's samples summed from the directory that prometheus_client's multiprocess mode
    writes (the parent sets PROMETHEUS_MULTIPROC_DIR before they start)."""
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        return REGISTRY
    merged = prom.CollectorRegistry()
    multiprocess.MultiProcessCollector(merged, path)  # type: ignore[no-untyped-call]
    return merged


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


CONTENT_TYPE = prom.CONTENT_TYPE_LATEST
