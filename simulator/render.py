"""vLLM 0.11 byte shapes shared by both endpoints: usage, error bodies, SSE pieces.

Sources: `entrypoints/openai/protocol.py` (UsageInfo field order prompt, total, completion;
ErrorResponse{error: ErrorInfo{message, type, param, code:int}}) and `serving_engine.py`
(`create_streaming_error_response` uses `json.dumps`, hence the spaces in the in-band error).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any, Protocol

import orjson

from simulator import tokens

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]  # Starlette adds charset
JSON_TYPE = (b"content-type", b"application/json")

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


class Render(Protocol):
    """One response's bytes: stream pieces in order, or the whole non-stream body."""

    def opening(self) -> bytes:
        """Bytes before the first token (chat: the role chunks)."""

    def step(self, index: int, k: int) -> bytes:
        """The chunk for token `k` of choice `index` (b"" when it shows nothing)."""

    def closing(self) -> bytes:
        """Bytes after the last token (the usage chunk), [DONE] excluded."""

    def body(self) -> bytes:
        """The non-streaming JSON body."""


def error_type(status: int) -> str:
    """vLLM's error `type` for a status; unknown ones fall back to the HTTP phrase."""
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    try:
        return HTTPStatus(status).phrase.replace(" ", "") + "Error"
    except ValueError:
        return "InternalServerError"


def usage(prompt: int, completion: int) -> dict[str, int]:
    """UsageInfo as vLLM orders it: prompt, total, completion."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def full_usage(prompt: int, completion: int) -> dict[str, Any]:
    """UsageInfo dumped with nulls (non-stream bodies, completions chunks)."""
    return {**usage(prompt, completion), "prompt_tokens_details": None}


def error_body(
    message: str, status: int, err_type: str | None = None, param: str | None = None
) -> bytes:
    """Compact pre-stream error body (Starlette JSONResponse of `ErrorResponse.model_dump()`)."""
    error = {
        "message": message,
        "type": err_type or error_type(status),
        "param": param,
        "code": status,
    }
    return orjson.dumps({"error": error})


def stream_error(message: str, status: int = 500, err_type: str | None = None) -> bytes:
    """In-band error event, spaced like `json.dumps` (vLLM 0.11 serving_engine)."""
    error = {
        "message": message,
        "type": err_type or error_type(status),
        "param": None,
        "code": status,
    }
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


def chunk_head(object_id: str, obj: str, created: int, model: str) -> bytes:
    """The constant start of every chunk of one stream, up to the choices list."""
    return (
        b'data: {"id":'
        + orjson.dumps(object_id)
        + b',"object":"'
        + obj.encode()
        + b'","created":'
        + str(created).encode()
        + b',"model":'
        + orjson.dumps(model)
        + b',"choices":['
    )


def prompt_logprobs(steps: list[tokens.PromptStep | None]) -> list[dict[str, Any] | None]:
    """`prompt_logprobs` as vLLM dumps list[dict[int, Logprob] | None]: ids as string keys,
    each Logprob dataclass as {logprob, rank, decoded_token} (v1/engine/logprobs.py)."""
    return [
        None if step is None else {
            str(i): {"logprob": lp, "rank": rank, "decoded_token": tokens.token_text(i)}
            for i, lp, rank in step
        }
        for step in steps
    ]
