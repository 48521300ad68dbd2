"""A small Triton server with a TensorRT-LLM ensemble, speaking its exact generate format.

Bytes from the real code: triton-inference-server/server src/http_server.cc (`data: ` + JSON +
`\\n\\n` per response on generate_stream, `text/event-stream; charset=utf-8`, no terminator;
response keys in std::map order with one-element tensors written as scalars; errors
`{"error": "..."}`, in the stream after HTTP 200 or as the body with the status of
HttpCodeFromError); the ensemble's inputs are validated with schemas/triton.py
(ensemble/config.pbtxt). Two generations of outputs (`app(shape=...)`):

- "current": TensorRT-LLM's ensemble/config.pbtxt routes the tensorrt_llm model's outputs to
  the client, and that model (tensorrt_llm/1/model.py `convert_response`, the C++ backend's
  `fillTritonResponse`) writes `cum_log_probs` / `output_log_probs` only when
  `return_log_probs` asks, `num_input_tokens` / `num_output_tokens` (this response's tokens)
  only when asked, `batch_index` / `sequence_index` only past one; with `model_name`,
  `model_version` and the `sequence_*` parameters, as its guided-decoding doc example shows.
- "legacy" (2024-era ensembles, their docs' recorded answers): always `context_logits`,
  `cum_log_probs`, `generation_logits` as 0.0 and `output_log_probs` zeros of the whole
  sequence so far (one more per streamed response), no `num_*_tokens` outputs (the gateway's
  `return_num_*` keys are then request parameters the model ignores).

Streamed `text_output` is each response's new text (the postprocessing model decodes the
tokens of that response); a streamed answer never holds the prompt (tensorrt_llm/1/model.py
subtracts the input only when not streaming), a whole one does unless `exclude_input_in_output`
(its config default, false, here). Stop words are kept in the text, as docs/llama.md shows.

The "model" answers a fixed script, word by word, whatever the prompt; directives in the prompt
inject faults: `[[error_after=N]]` (an error event after N responses), `[[drop_after=N]]` (the
connection is cut after N responses), `[[fail=S]]` (the model's first response is an error of
HTTP status S: a JSON body, or on a stream that error as its one SSE event).
A prompt that ends with the script's first words is continued after them, as a model goes on
from its own answer, clean of the stream faults (the continuation of a failed stream: the
prompt, or the rendered chat, plus the text already sent).
Run in-process (httpx.ASGITransport) or as a process:
`python -m tests.fakes.triton_fake PORT [current|legacy]`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from schemas import triton as wire

MODEL = "ensemble"
SCRIPT = [" The", " answer", " is", " 42", ".", "\n", " Ask", " again", "!"]


def _directive(text: str, name: str) -> int | None:
    m = re.search(r"\[\[" + name + r"=(\d+)\]\]", text)
    return int(m.group(1)) if m else None


def continued(prompt: str) -> int:
    """How many of the script's words the prompt ends with (the most; 0 for none)."""
    for k in range(len(SCRIPT), 0, -1):
        if prompt.endswith("".join(SCRIPT[:k])):
            return k
    return 0


def tokens(req: wire.GenerateRequest, start: int = 0) -> list[str]:
    """The script from `start` up to `max_tokens`, ending after a stop word (kept, as
    TensorRT-LLM does)."""
    out: list[str] = []
    for tok in SCRIPT[start:start + req.max_tokens]:
        out.append(tok)
        if any("".join(out).endswith(s) for s in req.stop_words or ()):
            break
    return out


def response(req: wire.GenerateRequest, text: str, count: int, shape: str,
             so_far: int | None = None) -> bytes:
    """One model response, keys in byte order (http_server.cc FinalizeResponse: std::map);
    `so_far`: the sequence's tokens up to this response (a legacy stream's log probs)."""
    fields: dict[str, Any] = {
        "model_name": MODEL, "model_version": "1",
        "sequence_end": False, "sequence_id": 0, "sequence_start": False, "text_output": text}
    if shape == "legacy":
        fields.update(context_logits=0.0, cum_log_probs=0.0, generation_logits=0.0,
                      output_log_probs=_scalar([0.0] * (so_far or count)))
        return orjson.dumps({k: fields[k] for k in sorted(fields)})
    if req.return_log_probs:
        fields.update(cum_log_probs=-0.5 * count, output_log_probs=_scalar([-0.5] * count))
    if req.return_num_input_tokens:
        fields["num_input_tokens"] = len(req.text_input.split())
    if req.return_num_output_tokens:
        fields["num_output_tokens"] = count
    return orjson.dumps({k: fields[k] for k in sorted(fields)})


def _scalar(values: list[float]) -> float | list[float]:
    """One element is written bare (http_server.cc ExactMappingOutput strips the array)."""
    return values[0] if len(values) == 1 else values


def _error(status: int, message: str) -> Response:
    return Response(orjson.dumps({"error": message}), status, media_type="application/json")


async def generate(request: Request) -> Response:
    model = request.path_params["model"]
    streaming = request.url.path.endswith("_stream")
    request.app.state.requests.append((request.url.path, orjson.loads(await request.body())))
    if model != MODEL:  # TRITONSERVER_ERROR_NOT_FOUND -> 404
        return _error(404, f"Request for unknown model: '{model}' is not found")
    try:
        req = wire.GenerateRequest.model_validate(request.app.state.requests[-1][1])
    except ValidationError as exc:
        return _error(400, f"unexpected inference input: {exc.errors()[0]['loc']}")
    if (status := _directive(req.text_input, "fail")) is not None:
        if streaming and req.stream:
            # The model's first response is an error: http_server.cc InferResponseComplete
            # takes the status from it (HttpCodeFromError) and writes it SSE-framed
            # (AddErrorJson) under the event-stream type (StartResponse).
            return _sse([b'data: {"error":"the model failed before inference"}\n\n'],
                        status=status)
        return _error(status, "the model failed before inference")
    start = continued(req.text_input)
    toks = tokens(req, start)
    shape = request.app.state.shape
    if not streaming or not req.stream:
        text, count = "".join(toks), len(toks)
        if not req.exclude_input_in_output:  # the prompt's tokens come back first
            text, count = req.text_input + text, count + len(req.text_input.split())
        body = response(req, text, count, shape)
        if streaming:
            return _sse([b"data: " + body + b"\n\n"])
        return Response(body, media_type="application/json")
    parts = [b"data: " + response(req, t, 1, shape, i + 1) + b"\n\n"
             for i, t in enumerate(toks)]
    faults = "" if start else req.text_input
    if (n := _directive(faults, "error_after")) is not None:
        # The C++ backend's error response (fillTritonResponse), the request's last.
        parts = parts[:n] + [b'data: {"error":"Executor failed process requestId 1 due to '
                             b'the following error: injected fault"}\n\n']
    drop = _directive(faults, "drop_after")
    return _sse(parts, drop)


def _sse(parts: list[bytes], drop: int | None = None, status: int = 200) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for i, part in enumerate(parts):
            if drop is not None and i == drop:
                raise ConnectionResetError("injected connection cut")
            yield part
    return StreamingResponse(body(), status, media_type="text/event-stream; charset=utf-8")


async def ready(request: Request) -> Response:
    return Response(b"", 200)


def app(shape: str = "current") -> Starlette:
    """`shape`: "current" or "legacy" outputs (module docstring)."""
    a = Starlette(routes=[
        Route("/v2/models/{model}/generate", generate, methods=["POST"]),
        Route("/v2/models/{model}/generate_stream", generate, methods=["POST"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
    ])
    a.state.requests = []
    a.state.shape = shape
    return a


if __name__ == "__main__":
    import uvicorn

    shape = sys.argv[2] if len(sys.argv) > 2 else "current"
    uvicorn.run(app(shape), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
