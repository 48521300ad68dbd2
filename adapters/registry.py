"""The one place protocol names map to adapter classes and client routes."""

from __future__ import annotations

from collections.abc import Callable

from adapters import base
from adapters.backends import openai as openai_backend
from adapters.backends import vllm
from adapters.frontends import openai as openai_frontend

BACKENDS: dict[str, type[base.Backend]] = {
    "vllm": vllm.VllmBackend,
    "openai": openai_backend.OpenAIBackend,
}

# Inference routes (POST): path (Starlette syntax) -> the frontend that serves it.
INFERENCE_ROUTES: list[tuple[str, Callable[[], base.Frontend]]] = [
    ("/v1/chat/completions", openai_frontend.OpenAIChatFrontend),
    ("/v1/completions", openai_frontend.OpenAICompletionsFrontend),
]

# Status routes (GET), answered from a snapshot of the gateway.
STATUS_ROUTES: list[tuple[str, base.StatusRoute]] = [
    ("/v1/models", openai_frontend.models),
    ("/health", openai_frontend.health),
]

# Model names that clients send as placeholders for "the one model": TGI serves one model
# whatever it is called, so text-generation's client sends "tgi" and huggingface_hub's
# InferenceClient "dummy" (SPEC.md, TGI front end). They reach `default_model` unless a model
# is really named so.
DEFAULT_MODEL_PLACEHOLDERS = ("tgi", "dummy")


def backend(name: str) -> base.Backend:
    return BACKENDS[name]()
