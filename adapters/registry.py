"""The one place protocol names map to adapter classes."""

from __future__ import annotations

from adapters import base
from adapters.backends import openai as openai_backend
from adapters.backends import vllm
from adapters.frontends import openai as openai_frontend

BACKENDS: dict[str, type[base.Backend]] = {
    "vllm": vllm.VllmBackend,
    "openai": openai_backend.OpenAIBackend,
}

# The simulator speaks vLLM's API.
WORKER_PROTOCOL: dict[str, str] = {"simulator": "vllm", "vllm": "vllm", "trtllm": "trtllm"}

FRONTENDS: dict[str, type[base.Frontend]] = {
    "openai_chat": openai_frontend.OpenAIChatFrontend,
    "openai_completions": openai_frontend.OpenAICompletionsFrontend,
}


def backend(name: str) -> base.Backend:
    return BACKENDS[name]()
