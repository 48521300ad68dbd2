"""A managed TensorRT-LLM worker: `trtllm-serve MODEL` (the `trtllm` worker protocol)."""

from __future__ import annotations

from adapters import base

WORKER = base.WorkerKind(
    command=("trtllm-serve", "{model}", "--host", "{host}", "--port", "{port}"),
    protocol="trtllm",
    model_dir=True,  # it loads `{model}` (a Hub id or a local directory) with its tokenizer
)
