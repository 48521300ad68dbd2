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

# Status routes that stay open when API keys are set: the health checks of orchestrators and
# load balancers (TGI's and vLLM's /health, SageMaker's /ping; SPEC.md server.api_keys).
OPEN_STATUS_ROUTES = frozenset({"/health", "/ping"})

# The embedded default config (`gateway serve` without --config): model `demo` served by a
# managed simulator on a free loopback port.
DEFAULT_CONFIG: dict[str, Any] = {
    "default_model": "demo",
    "models": [{"name": "demo", "backend": simulator.worker.PROTOCOL}],
    "workers": [{"kind": "simulator", "model": "demo", "port": 0}],
}

# Inference routes (POST): path (Starlette syntax) -> the frontend that serves it. A frontend
# serves every request of its route, so it holds no request's state (its translators do).
INFERENCE_ROUTES: list[tuple[str, Callable[[], base.Frontend]]] = [
    # OpenAI's chat; TGI's placeholder model names are answered in TGI's Messages API shape.
    ("/v1/chat/completions", openai_frontend.OpenAIChatFrontend),
    ("/v1/completions", openai_frontend.OpenAICompletionsFrontend),
    # TGI: one frontend per route, so that errors take that route's form (tgi.TgiFrontend).
    ("/generate", tgi.TgiGenerateFrontend),
    ("/generate_stream", tgi.TgiStreamFrontend),
    ("/", tgi.TgiCompatFrontend),
    # Elasticsearch's inference API (x-pack inference rest/Paths.java); `{id}` is a model name.
    ("/_inference/{id}/_unified", elastic.ElasticChatFrontend),
    ("/_inference/{id}/_stream", elastic.ElasticChatFrontend),
    ("/_inference/chat_completion/{id}/_unified", elastic.ElasticChatFrontend),
    ("/_inference/chat_completion/{id}/_stream", elastic.ElasticChatFrontend),
    # Elasticsearch 9.6 (PR #158022): without `_stream`, a non-streaming chat completion.
    ("/_inference/chat_completion/{id}", elastic.ElasticChatWholeFrontend),
    ("/_inference/completion/{id}", elastic.ElasticCompletionFrontend),
    ("/_inference/completion/{id}/_stream", elastic.ElasticCompletionStreamFrontend),
    # LMI / SageMaker (DJL Serving InferenceRequestHandler); the body picks the schema.
    ("/invocations", lmi.LmiFrontend),
    ("/predictions/{model}", lmi.LmiFrontend),
]

# Status routes (GET), answered from a snapshot of the gateway.
STATUS_ROUTES: list[tuple[str, base.StatusRoute]] = [
    ("/v1/models", openai_frontend.models),
    ("/health", tgi.health),  # TGI's: 200 empty, 503 with its ErrorResponse
    ("/", tgi.health),  # TGI answers GET / as /health
    ("/info", tgi.info),
    ("/ping", lmi.ping),  # LMI / SageMaker health check
]

# The frontend whose error body each status route answers in (a missing API key, a bug), so
# that a client reads a refusal of /v1/models or /info as it reads one of its inference routes.
STATUS_ERRORS: dict[str, Callable[[], base.Frontend]] = {
    "/v1/models": openai_frontend.OpenAICompletionsFrontend,
    "/health": tgi.TgiFrontend,
    "/": tgi.TgiFrontend,
    "/info": tgi.TgiFrontend,
    "/ping": lmi.LmiFrontend,
}


def backend(name: str) -> base.Backend:
    return BACKENDS[name]()
