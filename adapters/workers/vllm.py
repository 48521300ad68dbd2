"""A managed vLLM worker: `vllm serve MODEL` (vLLM's OpenAI-compatible server, the `vllm`
worker protocol)."""

from __future__ import annotations

from adapters import base

WORKER = base.WorkerKind(
    command=("vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}"),
    protocol="vllm",
)
