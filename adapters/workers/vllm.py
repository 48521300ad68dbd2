"""A managed vLLM worker: `vllm serve MODEL` (vLLM's OpenAI-compatible server, the `vllm`
worker protocol)."""

from __future__ import annotations

from adapters import base

WORKER = base.WorkerKind(
    command=("vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}"),
    protocol="vllm",
    model_dir=True,  # it loads `{model}` (a Hub id or a local directory) with its tokenizer
)
