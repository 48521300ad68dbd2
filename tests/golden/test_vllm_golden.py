"""Golden transcripts of the OpenAI-style worker protocols (vllm, trtllm): the upstream request we build for a client
request, and the canonical events decoded from a worker's recorded bytes.

Worker bytes follow vLLM 0.11 (`serving_chat.py` / `serving_completion.py`,
`model_dump_json(exclude_unset=True)`; usage order prompt, total, completion from
`engine/protocol.py UsageInfo`) as collected in shared/research/wire-formats.md section 3.
The in-band error case is vLLM's mid-stream `data: {"error": {...}}` then `data: [DONE]` (3.5);
its refusal case is the same event as the first of a stream, a 400 in its `code`: a check that
runs in AsyncLLM.add_request (vllm/v1/engine/async_llm.py; here --max-logprobs 5), which the
stream's generator calls, so it reaches the client under HTTP 200 (engine/serving.py
create_streaming_error_response).
trtllm-serve bytes follow tensorrt_llm/serve/openai_server.py and postprocess_handlers.py
(section 6.1): `exclude_none` chunks, the first written as `data: {...} \n\n`, a usage chunk
with every field, and on a mid-stream failure the connection just ends; TensorRT-LLM's own
finish reasons pass through (executor/result.py: stop, length, timeout, cancelled).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from adapters import base, registry
from adapters.frontends import openai as frontend
from schemas import canonical, errors
from tests.golden import runner

TARGET = base.Target("http://worker:8000/", "meta-llama/Llama-3.1-8B-Instruct")


def parse(case: Path) -> canonical.InferenceRequest:
    body = (case / "request.json").read_bytes()
    fe = frontend.OpenAIChatFrontend() if b'"messages"' in body else \
        frontend.OpenAICompletionsFrontend()
    return fe.parse(body, base.RequestContext()).request


CASES = [c for kind in ("vllm", "trtllm") for c in runner.cases(kind)]


def _backend(case: Path) -> base.Backend:
    return registry.backend(case.parent.name)


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_upstream_request(case: Path, update_goldens: bool) -> None:
    req = parse(case)
    backend = _backend(case)
    try:
        backend.check(req)
    except errors.GatewayError as exc:
        runner.check_bytes(case / "upstream.txt", f"refused {exc.status}: {exc.message}\n"
                           .encode(), update_goldens)
        return
    up = backend.build(req, TARGET)
    pretty = orjson.dumps(orjson.loads(up.body), option=orjson.OPT_INDENT_2)
    runner.check_bytes(case / "upstream.txt",
                       f"{up.method} {up.url}\n".encode() + pretty + b"\n", update_goldens)


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_worker_bytes_to_events(case: Path, update_goldens: bool) -> None:
    req = parse(case)
    dec = _backend(case).decoder(req, streaming=req.stream)
    try:
        events = dec.feed((case / "worker.txt").read_bytes()) + dec.close()
        text = runner.dump_events(events)
    except errors.GatewayError as exc:
        text = orjson.dumps({"raise": type(exc).__name__, "message": exc.message}).decode() + "\n"
    runner.check_bytes(case / "events.jsonl", text.encode(), update_goldens)
