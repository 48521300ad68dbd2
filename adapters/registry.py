"""The one place protocol names map to adapter classes and client routes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

import simulator.worker
from adapters import base
from adapters.backends import openai as openai_backend
from adapters.backends import tgi as tgi_backend
from adapters.backends import triton, trtllm, vllm
from adapters.frontends import elastic, lmi, tgi
from adapters.frontends import openai as openai_frontend
from adapters.workers import trtllm as trtllm_worker
from adapters.workers import vllm as vllm_worker
from schemas import elastic as elastic_schema
from schemas import lmi as lmi_schema
from schemas import openai as openai_schema

BACKENDS: dict[str, type[base.Backend]] = {
    "vllm": vllm.VllmBackend,
    "openai": openai_backend.OpenAIBackend,
    "trtllm": trtllm.TrtllmBackend,
    "triton": triton.TritonBackend,
    "tgi": tgi_backend.TgiBackend,
}

SUMMARY = ("An LLM inference gateway: OpenAI, LMI/SageMaker, TGI and Elastic clients in front of "
           "vLLM, TensorRT-LLM, TGI and OpenAI-compatible workers.")

# The worker protocol of a model that names none.
DEFAULT_BACKEND = "vllm"

# Managed worker kinds (`workers[].kind`), their command lines declared in their own modules.
WORKER_KINDS: dict[str, base.WorkerKind] = {
    "vllm": vllm_worker.WORKER,
    "trtllm": trtllm_worker.WORKER,
    "simulator": base.WorkerKind(simulator.worker.COMMAND, simulator.worker.PROTOCOL,
                                 simulator.worker.STARTS_FAST),
}

# Options a protocol declares: per model (`models[].<key>`) and gateway-wide (`<key>`); the
# gateway's config schema is assembled from these (gateway/config.py).
MODEL_OPTIONS: dict[str, type[BaseModel]] = {"lmi": lmi_schema.LmiOptions}
GATEWAY_OPTIONS: dict[str, type[BaseModel]] = {"elastic": elastic_schema.ElasticOptions}

# `Authorization: <scheme> <key>` schemes the clients of the front ends send.
AUTH_SCHEMES = frozenset({openai_schema.AUTH_SCHEME, elastic_schema.AUTH_SCHEME})

# The embedded default config (`gateway serve` without --config): model `demo` served by a
# managed simulator on a free loopback port.
DEFAULT_CONFIG: dict[str, Any] = {
    "default_model": "demo",
    "models": [{"name": "demo", "backend": simulator.worker.PROTOCOL}],
    "workers": [{"kind": "simulator", "model": "demo", "port": 0}],
}

# The client protocols, each declaring its routes (ROUTES, STATUS_ROUTES) in its own module.
_FRONTENDS = (openai_frontend, tgi, elastic, lmi)

# Inference routes (POST): path (Starlette syntax) -> the frontend that serves it. A frontend
# serves every request of its route, so it holds no request's state (its translators do).
INFERENCE_ROUTES: list[tuple[str, Callable[[], base.Frontend]]] = [
    (r.path, r.frontend) for m in _FRONTENDS for r in m.ROUTES]


def _shared(owner: base.StatusRouteSpec,
            claimed: list[base.StatusRouteSpec]) -> base.StatusRoute:
    """One answer for a path several protocols' status routes hold: the first route that
    claims the request answers it, else the path's own."""
    if not claimed:
        return owner.answer

    def answer(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
        for spec in claimed:
            assert spec.claims is not None
            if spec.claims(ctx.headers):
                return spec.answer(view, ctx)
        return owner.answer(view, ctx)

    return answer


# Status routes (GET), answered from a snapshot of the gateway; a route that claims requests by
# their headers shares the path of another protocol's route.
_ALL_STATUS = [r for m in _FRONTENDS for r in m.STATUS_ROUTES]
_STATUS: list[base.StatusRouteSpec] = [r for r in _ALL_STATUS if r.claims is None]
STATUS_ROUTES: list[tuple[str, base.StatusRoute]] = [
    (r.path, _shared(r, [c for c in _ALL_STATUS if c.claims is not None and c.path == r.path]))
    for r in _STATUS]

# The frontend whose error body each status route answers in (a missing API key, a bug), so
# that a client reads a refusal of /v1/models or /info as it reads one of its inference routes.
STATUS_ERRORS: dict[str, Callable[[], base.Frontend]] = {r.path: r.errors for r in _STATUS}

# The protocol of each route's first path segment (`v1`, `_inference`, `invocations`, ``
# for TGI's `/`, ...): a request no route takes is refused in that protocol's error body.
_BY_SEGMENT: dict[str, Callable[[], base.Frontend]] = {}
for _path, _make in INFERENCE_ROUTES:
    _BY_SEGMENT.setdefault(_path.split("/")[1], _make)
for _spec in _STATUS:
    _BY_SEGMENT.setdefault(_spec.path.split("/")[1], _spec.errors)


# Request headers a protocol's server copies onto every answer it gives (a protocol module's
# ECHOED_HEADERS, if any: Elasticsearch's X-Opaque-Id), by the frontend that answers them.
_ECHOED: dict[Callable[[], base.Frontend], tuple[str, ...]] = {
    make: m.ECHOED_HEADERS for m in _FRONTENDS if getattr(m, "ECHOED_HEADERS", ())
    for make in (*(r.frontend for r in m.ROUTES), *(r.errors for r in m.STATUS_ROUTES))}


def echoed(frontend: Callable[[], base.Frontend] | None) -> tuple[str, ...]:
    """The request headers the answers of `frontend`'s protocol carry back."""
    return _ECHOED.get(frontend, ()) if frontend is not None else ()


# The same for each status route: those of its own protocol and of each that claims its path.
STATUS_ECHOED: dict[str, tuple[str, ...]] = {
    r.path: tuple(dict.fromkeys(h for c in _ALL_STATUS if c.path == r.path
                                for h in echoed(c.errors)))
    for r in _STATUS}


def errors_for(path: str) -> Callable[[], base.Frontend] | None:
    """The frontend whose error body answers a request for `path` that no route takes (a
    method its route does not take, or a path under a protocol's prefix); None for a path
    under no protocol's."""
    return _BY_SEGMENT.get(path.split("/")[1] if path.startswith("/") else "")


# Status routes that stay open when API keys are set: the health checks of orchestrators and
# load balancers (TGI's and vLLM's /health, SageMaker's /ping; SPEC.md server.api_keys).
OPEN_STATUS_ROUTES = frozenset(r.path for r in _STATUS if r.open)


def backend(name: str) -> base.Backend:
    return BACKENDS[name]()
