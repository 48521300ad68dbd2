"""An OpenAI-style worker's error body, as the message a client may read.

trtllm-serve answers a request FastAPI cannot validate with 400 `{"error": str(exc)}`
(tensorrt_llm/serve/openai_server.py validation_exception_handler), and vLLM with its
ErrorResponse whose message is built the same way from `exc.errors()` (vllm/entrypoints/serve/
utils/server_utils.py validation_exception_handler). That text is a count, then each pydantic
error dict's repr, which holds the client's whole body as `input`; since FastAPI 0.124
(fastapi/exceptions.py ValidationException.__str__) also the server's file, line and endpoint;
before it, `str(exc)` was the error list's repr. A client reads "`field`: message" for the
first error, as for the gateway's own refusals (adapters/validation.py).
"""

from __future__ import annotations

import ast
import re
from typing import Any

import orjson

from adapters import validation

_STR = r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*\""""
# The first error dict: right after the count line (each repr on its own line, so no string
# inside `input` can start one: a repr writes its newlines as `\n`) or first in the list repr.
# pydantic's key order is type, loc, msg, input, ctx (FastAPI keeps it, replacing `loc`).
_FIRST = re.compile(
    rf"(?:\A\[|\A\d+ validation errors?:\n  )\{{'type': (?:{_STR}), "
    rf"'loc': \(((?:(?:{_STR}|-?\d+)(?:, |,)?)*)\), 'msg': ({_STR})")
_COUNT = re.compile(r"\A(\d+) validation errors?:\n")


def message(body: bytes) -> str:
    """The message of any OpenAI-style error body: nested, flat (trtllm-serve) or a string.
    A body that is not JSON (a proxy's HTML page), or JSON with no message text, is no message
    for a client: empty (never a Python repr of the worker's body)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            detail = err.get("detail")
            if isinstance(detail, list) and not err.get("message"):
                return _validation_detail(detail)
            return text(err.get("message") or detail)
        return text(err)
    return text(obj)


def param(body: bytes) -> str | None:
    """The field an OpenAI-style error body names (`param`, nested or flat), without vLLM's
    `body.` prefix (clean_loc_for_param): what a model-level validator's error names, whose
    FastAPI location is the body alone."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    err = obj.get("error", obj) if isinstance(obj, dict) else None
    value = err.get("param") if isinstance(err, dict) else None
    if not isinstance(value, str) or not value:
        return None
    return value.removeprefix("body.") or None


def event_message(err: Any) -> str:
    """The message of an error event inside a stream (`{"error": {"message": ...}}` or
    `{"error": "..."}`); a plain failure when it holds no text."""
    return text(err.get("message") if isinstance(err, dict) else err) \
        or "the worker reported an error"


def text(value: Any) -> str:
    """A worker's message when it is text; anything else (an object, a list) says nothing a
    client should read."""
    return value if isinstance(value, str) else ""


def _validation_detail(items: list[Any]) -> str:
    """FastAPI's own 422 body, `{"detail": [{"loc", "msg", ...}]}`
    (fastapi/exception_handlers.py request_validation_exception_handler), as one line that
    names each field in backticks: what an OpenAI-compatible server on FastAPI answers when it
    leaves request validation to FastAPI (vLLM and trtllm-serve replace that handler)."""
    parts = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("msg"), str):
            loc = [str(p) for p in item.get("loc") or () if p != "body"]
            parts.append(f"`{'.'.join(loc)}`: {item['msg']}" if loc else item["msg"])
    return "; ".join(parts)


def reduce(text: str) -> tuple[str, str | None] | None:
    """"`field`: message" for the first error of FastAPI validation `text`, and the field;
    None when `text` is not such text."""
    m = _FIRST.match(text)
    if m is None:
        return None
    try:
        loc = ast.literal_eval(f"({m.group(1)})")
        msg = ast.literal_eval(m.group(2))
    except (ValueError, SyntaxError):
        return None
    if not isinstance(loc, tuple):  # `('body')` is a string, never FastAPI's repr
        loc = (loc,)
    field = validation.dotted(_after_body(loc)) or None
    out = f"`{field}`: {msg}" if field else str(msg)
    count = _COUNT.match(text)
    more = int(count.group(1)) - 1 if count else 0
    if more > 0:
        out += f" (and {more} more error{'s' if more > 1 else ''})"
    return out, field


def _after_body(loc: tuple[object, ...]) -> tuple[object, ...]:
    """The place in the body: FastAPI's leading `body`, and a model-level validator's wrapper
    (`function-wrap[__log_extra_fields__()]`, vLLM's clean_loc_for_param), are not fields."""
    parts = list(loc)
    if parts[:1] == ["body"]:
        parts.pop(0)
    while parts and isinstance(parts[0], str) and "[" in parts[0]:
        parts.pop(0)
    return tuple(parts)
