"""A small TGI server speaking its exact formats: /generate, /generate_stream, its chat API.

Bytes from TGI's router @ db931fcf (v3.3.7), as shared/research/wire-formats.md section 4
collects them: lib.rs (StreamResponse, Token, StreamDetails, GenerateResponse, Details,
BestOfSequence, PrefillToken; field order and omissions), server.rs (`generate_stream_internal`:
index from 1, generated_text and details only on the last event, validation errors as an event
after HTTP 200, no terminator; `From<InferError>` statuses), chat.rs / lib.rs (chat chunks with
`object` first, `id` "", the role in every delta, a usage chunk, `data: [DONE]`; errors in a
chat stream `{"error":{"message","http_status_code":422}}`), utils/tokens.py StoppingCriteria
(length first, then EOS, then a stop sequence at the end of the text, which is kept). Requests
are validated as validation.rs does, with the TGI front end's port of it (its messages).

The "model" answers a fixed script then EOS; directives in the prompt inject faults:
`[[error_after=N]]` (a generation error after N tokens), `[[overloaded]]`, `[[drop_after=N]]`.
A chat whose last message is the assistant's is continued, as TGI >= 3.0 does (chat_template.rs
`apply`: the prompt cut after that message's content, its end whitespace trimmed): the script
goes on after the words that content holds, clean of the stream faults (the continuation of a
failed stream, whose user message still carries them).
Run in-process (httpx.ASGITransport) or as a process: `python -m tests.fakes.tgi_fake PORT`.
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

from adapters.frontends import tgi as tgi_rules
from schemas import errors
from schemas import tgi as wire

MODEL_ID = "tgi-fake/model"
FINGERPRINT = "3.3.7-native"
SCRIPT = [(" The", 415), (" answer", 4372), (" is", 349), (" 42", 28705), (".", 28723),
          ("\n", 13), (" Ask", 26703), (" again", 1076), ("!", 28808)]
EOS = ("</s>", 2)
SSE = "text/event-stream"
MAX_TOTAL_TOKENS = 4096  # launcher default when the model config gives none
DEFAULT_GENERATION_LENGTH = 1024  # validation.rs: a larger max_new_tokens is checked as this


def _directive(text: str, name: str) -> int | None:
    m = re.search(r"\[\[" + name + r"(?:=(\d+))?\]\]", text)
    return (int(m.group(1)) if m.group(1) else 0) if m else None


def generate_tokens(max_new: int, stop: list[str], start: int = 0
                    ) -> tuple[list[dict[str, Any]], str]:
    """Tokens and finish reason, as StoppingCriteria decides after each token; `start`: the
    script's tokens already in the prompt (a continued assistant message)."""
    out: list[dict[str, Any]] = []
    text = ""
    for i, (tok, tid) in enumerate([*SCRIPT, EOS][start:], start):
        special = (tok, tid) == EOS
        out.append({"id": tid, "text": tok, "logprob": -0.5 - i / 8, "special": special})
        text += "" if special else tok
        if len(out) >= max_new:
            return out, "length"
        if special:
            return out, "eos_token"
        if any(text.endswith(s) for s in stop):
            return out, "stop_sequence"
    raise AssertionError("unreachable")


def _text(toks: list[dict[str, Any]]) -> str:
    return "".join(t["text"] for t in toks if not t["special"])


def _top(t: dict[str, Any], n: int) -> list[dict[str, Any]]:
    alt = {"id": 1000, "text": " maybe", "logprob": t["logprob"] - 1.0, "special": False}
    return [t, alt][:n]


def _validate(data: Any, stream: bool) -> wire.GenerateRequest:
    """validation.rs, via the TGI front end's port; errors carry InferError's prefix."""
    try:
        raw = wire.GenerateRequest.model_validate(data)
        tgi_rules.to_canonical(raw, stream, False)
    except (errors.InvalidRequest, ValidationError) as exc:
        message = exc.message if isinstance(exc, errors.InvalidRequest) else str(exc)
        raise ValueError(f"Input validation error: {message}") from None
    n_in, n_new = len(raw.inputs.split()), min((raw.parameters or wire.GenerateParameters()
                                                 ).max_new_tokens or 0, DEFAULT_GENERATION_LENGTH)
    # validation.rs validate_input: the limit checked is at most DEFAULT_GENERATION_LENGTH (the
    # rest is generated in re-queued chunks), so a large max_new_tokens alone passes.
    if n_in + n_new > MAX_TOTAL_TOKENS:  # ValidationError::MaxTotalTokens
        raise ValueError(f"Input validation error: `inputs` tokens + `max_new_tokens` must be "
                         f"<= {MAX_TOTAL_TOKENS}. Given: {n_in} `inputs` tokens and {n_new} "
                         "`max_new_tokens`")
    return raw


def _err(message: str, kind: str) -> bytes:
    return orjson.dumps({"error": message, "error_type": kind})


async def generate_stream(request: Request) -> Response:
    return _stream(request, orjson.loads(await request.body()))


def _stream(request: Request, data: Any) -> Response:
    request.app.state.requests.append((request.url.path, data))
    try:
        raw = _validate(data, True)
    except ValueError as exc:  # server.rs: every check runs inside the stream, after HTTP 200
        return _sse([b"data: " + _err(str(exc), "validation") + b"\n\n"])
    if request.app.state.overloaded or _directive(raw.inputs, "overloaded") is not None:
        return _sse([b"data: " + _err("Model is overloaded", "overloaded") + b"\n\n"])
    p = raw.parameters or wire.GenerateParameters()
    toks, reason = generate_tokens(p.max_new_tokens or 100, p.stop or [])
    parts = []
    for i, t in enumerate(toks):
        ev: dict[str, Any] = {"index": i + 1, "token": t}
        if p.top_n_tokens:
            ev["top_tokens"] = _top(t, p.top_n_tokens)
        last = i == len(toks) - 1
        ev["generated_text"] = _prefix(raw) + _text(toks) if last else None
        ev["details"] = {"finish_reason": reason, "generated_tokens": len(toks), "seed": p.seed,
                         "input_length": len(raw.inputs.split())} if last and p.details else None
        parts.append(b"data: " + orjson.dumps(ev) + b"\n\n")
    if (n := _directive(raw.inputs, "error_after")) is not None:
        parts = parts[:n] + [b"data: " + _err("Request failed during generation: injected",
                                               "generation") + b"\n\n"]
    return _sse(parts, _directive(raw.inputs, "drop_after"))


async def generate(request: Request) -> Response:
    return _whole(request, orjson.loads(await request.body()))


def _whole(request: Request, data: Any) -> Response:
    request.app.state.requests.append((request.url.path, data))
    try:
        raw = _validate(data, False)
    except ValueError as exc:
        return Response(_err(str(exc), "validation"), 422, media_type="application/json")
    if request.app.state.overloaded or _directive(raw.inputs, "overloaded") is not None:
        return Response(_err("Model is overloaded", "overloaded"), 429,
                        media_type="application/json")
    p = raw.parameters or wire.GenerateParameters()
    toks, reason = generate_tokens(p.max_new_tokens or 100, p.stop or [])
    body: dict[str, Any] = {"generated_text": _prefix(raw) + _text(toks)}
    if p.details or p.decoder_input_details:
        body["details"] = _details(raw.inputs, p, toks, reason)
    return Response(orjson.dumps(body), media_type="application/json")


def _prefix(raw: wire.GenerateRequest) -> str:
    """server.rs generate(_stream)_internal: the prompt before the text with return_full_text."""
    return raw.inputs if raw.parameters and raw.parameters.return_full_text else ""


async def compat_generate(request: Request) -> Response:
    """POST / (server.rs compat_generate): return_full_text defaults to true (the pipeline tag
    is text-generation), `stream` picks the route, and a whole answer is wrapped in a list."""
    data = orjson.loads(await request.body())
    params = data.get("parameters") if isinstance(data, dict) else None
    if isinstance(params, dict) and params.get("return_full_text") is None:
        params["return_full_text"] = True
    elif isinstance(data, dict) and "parameters" not in data:
        data["parameters"] = {"do_sample": True, "return_full_text": True}  # default_parameters
    if isinstance(data, dict) and data.get("stream"):
        return _stream(request, data)
    resp = _whole(request, data)
    if resp.status_code != 200:
        return resp
    return Response(b"[" + bytes(resp.body) + b"]", media_type="application/json")


async def info(request: Request) -> Response:
    """GET /info: lib.rs Info in its order, with the launcher's defaults."""
    return Response(orjson.dumps({
        "model_id": MODEL_ID, "model_sha": None, "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": 128, "max_best_of": 2, "max_stop_sequences": 4,
        "max_input_tokens": MAX_TOTAL_TOKENS - 1, "max_total_tokens": MAX_TOTAL_TOKENS,
        "validation_workers": 2, "max_client_batch_size": 4,
        "router": "text-generation-router", "version": FINGERPRINT.split("-")[0], "sha": None,
        "docker_label": None}), media_type="application/json")


def _details(inputs: str, p: wire.GenerateParameters, toks: list[dict[str, Any]],
             reason: str) -> dict[str, Any]:
    """lib.rs Details, in its order; the other sequence of best_of: the same, less likely."""
    prefill = [{"id": 100 + i, "text": w, "logprob": None if i == 0 else -1.0}
               for i, w in enumerate(inputs.split())] if p.decoder_input_details else []
    d: dict[str, Any] = {"finish_reason": reason, "generated_tokens": len(toks), "seed": p.seed,
                         "prefill": prefill, "tokens": toks}
    if (p.best_of or 1) > 1:  # the other sequence, less likely (infer/mod.rs generate_best_of:
        other = [{**t, "logprob": t["logprob"] - 1.0} for t in toks]  # best mean logprob first)
        full = inputs if p.return_full_text else ""  # generate_internal adds it to each one
        d["best_of_sequences"] = [{"generated_text": full + _text(other), "finish_reason": reason,
                                   "generated_tokens": len(other), "seed": None,
                                   "prefill": prefill, "tokens": other}]
    if p.top_n_tokens:
        d["top_tokens"] = [_top(t, p.top_n_tokens) for t in toks]
    return d


def _chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None) -> bytes:
    return b"data: " + orjson.dumps({
        "object": "chat.completion.chunk", "id": "", "created": 1, "model": MODEL_ID,
        "system_fingerprint": FINGERPRINT, "choices": choices, "usage": usage}) + b"\n\n"


def _chat_logprobs(t: dict[str, Any], n: int) -> dict[str, Any]:
    tops = [{"token": a["text"], "logprob": a["logprob"]} for a in _top(t, n)]
    return {"content": [{"token": t["text"], "logprob": t["logprob"], "top_logprobs": tops}]}


async def chat(request: Request) -> Response:
    data = orjson.loads(await request.body())
    request.app.state.requests.append((request.url.path, data))
    if not isinstance(data.get("stop", []), list):  # Option<Vec<String>>: axum's rejection
        return Response(b"Failed to deserialize the JSON body into the target type: stop: "
                        b"invalid type: string", 422, media_type="text/plain; charset=utf-8")
    params = {"max_new_tokens": data.get("max_tokens"), "stop": data.get("stop") or [],
              "top_p": data.get("top_p"), "seed": data.get("seed"), "details": True,
              "top_n_tokens": data.get("top_logprobs")}
    if data.get("temperature") not in (None, 0.0, 0):  # try_into_generate: 0 means greedy
        params["temperature"] = data["temperature"]
    prompt = " ".join(str(m.get("content") or "") for m in data["messages"])
    start = continued(data["messages"])
    stream = bool(data.get("stream"))
    try:
        _validate({"inputs": prompt, "parameters": params}, stream)
    except ValueError as exc:
        if stream:
            return _sse([_error_event(str(exc)), b"data: [DONE]\n\n"])
        return Response(_err(str(exc), "validation"), 422, media_type="application/json")
    toks, reason = generate_tokens(data.get("max_tokens") or 100, data.get("stop") or [],
                                   start)
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(toks),
             "total_tokens": len(prompt.split()) + len(toks)}
    finish = "stop" if reason == "eos_token" else reason  # FinishReason::format(true)
    if not stream:
        return Response(orjson.dumps(_chat_whole(data, toks, finish, usage)),
                        media_type="application/json")
    faults = "" if start else prompt
    return _sse(_chat_stream(data, faults, toks, finish, usage),
                _directive(faults, "drop_after"))


def continued(messages: list[dict[str, Any]]) -> int:
    """How many script tokens a final assistant message holds, trimmed as TGI trims it (0: no
    such message; the first tokens that make up its trimmed content, or all up to EOS)."""
    if not messages or messages[-1].get("role") != "assistant":
        return 0
    content = str(messages[-1].get("content") or "").rstrip()
    text = ""
    for k, (tok, _) in enumerate(SCRIPT):
        if text.rstrip() == content and content:
            return k
        text += tok
    return len(SCRIPT)


def _error_event(message: str) -> bytes:
    return b"data: " + orjson.dumps({"error": {"message": message,
                                               "http_status_code": 422}}) + b"\n\n"


def _chat_whole(data: dict[str, Any], toks: list[dict[str, Any]], finish: str,
                usage: dict[str, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": _text(toks)}
    if data.get("tools") and data.get("tool_choice") != "none":
        fn = data["tools"][0]["function"]
        message = {"role": "assistant", "tool_calls": [{"id": "0", "type": "function", "function": {
            "description": None, "name": fn["name"], "arguments": '{"city":"Paris"}'}}]}
    logprobs = None
    if data.get("logprobs"):
        logprobs = {"content": [c for t in toks
                                for c in _chat_logprobs(t, data.get("top_logprobs") or 0)["content"]]}
    return {"object": "chat.completion", "id": "", "created": 1, "model": MODEL_ID,
            "system_fingerprint": FINGERPRINT, "choices": [{
                "index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}],
            "usage": usage}


def _tool_deltas(name: str) -> list[bytes]:
    """chat.rs ChatState (v3.3.7) on a grammar-made call: nothing until `_name` parses, then
    a delta naming the function with `{` as its arguments, the rest as nameless fragments, the
    last closing brace trimmed; id "0", the finish on the last token's chunk."""
    frags = [("{", name), ('"city":', None), ('"Paris"}', None)]
    return [_chunk([{"index": 0, "delta": {"role": "assistant", "tool_calls": [{
        "index": 0, "id": "0", "type": "function", "function": {"name": n, "arguments": a}}]},
        "logprobs": None, "finish_reason": "stop" if k == len(frags) - 1 else None}], None)
        for k, (a, n) in enumerate(frags)]


def _chat_stream(data: dict[str, Any], prompt: str, toks: list[dict[str, Any]], finish: str,
                 usage: dict[str, int]) -> list[bytes]:
    if data.get("tools") and data.get("tool_choice") != "none":
        calls = _tool_deltas(data["tools"][0]["function"]["name"])
        if (data.get("stream_options") or {}).get("include_usage"):
            calls.append(_chunk([], {**usage, "completion_tokens": len(calls),
                                     "total_tokens": usage["prompt_tokens"] + len(calls)}))
        return [*calls, b"data: [DONE]\n\n"]
    parts = []
    for i, t in enumerate(toks):
        content = "" if t["special"] else t["text"]
        lp = _chat_logprobs(t, data.get("top_logprobs") or 0) if data.get("logprobs") else None
        parts.append(_chunk([{"index": 0, "delta": {"role": "assistant", "content": content},
                              "logprobs": lp,
                              "finish_reason": finish if i == len(toks) - 1 else None}], None))
    if (n := _directive(prompt, "error_after")) is not None:
        parts = parts[:n] + [_error_event("Request failed during generation: injected")]
    elif (data.get("stream_options") or {}).get("include_usage"):
        parts.append(_chunk([], usage))
    return [*parts, b"data: [DONE]\n\n"]


def _sse(parts: list[bytes], drop: int | None = None) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for i, part in enumerate(parts):
            if drop is not None and i == drop:
                raise ConnectionResetError("injected connection cut")
            yield part
    # server.rs: X-Accel-Buffering: no; axum's Sse sets the media type and no-cache.
    return StreamingResponse(body(), media_type=SSE, headers={
        "cache-control": "no-cache", "x-accel-buffering": "no"})


async def health(request: Request) -> Response:
    return Response(b"", 200)


def app(overloaded: bool = False) -> Starlette:
    """The fake; `overloaded` answers every generate request as an overloaded TGI does."""
    a = Starlette(routes=[
        Route("/", compat_generate, methods=["POST"]),
        Route("/info", info, methods=["GET"]),
        Route("/generate", generate, methods=["POST"]),
        Route("/generate_stream", generate_stream, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ])
    a.state.requests = []
    a.state.overloaded = overloaded
    return a


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
