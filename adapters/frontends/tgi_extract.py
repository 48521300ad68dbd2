"""TGI's request bodies as its axum `Json<GenerateRequest>` extractor reads them, before the
handler: refusals are axum's plain-text rejections with their statuses, never stream events.

Source: axum 0.7 `extract/rejection.rs` and `json.rs` (TGI router server.rs takes
`Json(req): Json<GenerateRequest>` on /generate, /generate_stream and /):
- `MissingJsonContentType` 415 "Expected request with `Content-Type: application/json`" when the
  media type is not `application/json` or `application/*+json`;
- `JsonSyntaxError` 400 "Failed to parse the request body as JSON: <serde error>" for bytes
  that are not JSON (empty, invalid UTF-8, NaN, nesting past serde_json's limit);
- `JsonDataError` 422 "Failed to deserialize the JSON body into the target type: <path>:
  <serde error>" for JSON of the wrong shape (not an object, `{"inputs": 5}`, no `inputs`).
The parameter checks TGI runs inside the handler (validation.rs) stay in tgi.py.
Deviation: a request with no Content-Type at all is read as JSON (axum refuses it with 415),
so that hand-written clients that omit the header keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from schemas import errors

M = TypeVar("M", bound=BaseModel)

SYNTAX = "Failed to parse the request body as JSON"
DATA = "Failed to deserialize the JSON body into the target type"
MEDIA = "Expected request with `Content-Type: application/json`"
# serde_json's recursion limit: deeper bodies are a syntax error ("recursion limit exceeded").
MAX_DEPTH = 128


def extract(body: bytes, headers: Mapping[str, str], model: type[M]) -> M:
    """The body as `model`, or MalformedBody with axum's status and text."""
    if not json_media_type(headers.get("content-type")):
        raise errors.MalformedBody(MEDIA, status=415)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        what = ("EOF while parsing a value" if not body.strip() else exc.msg.split(":")[0])
        raise errors.MalformedBody(f"{SYNTAX}: {what} at line {exc.lineno} column "
                                   f"{exc.colno - 1 if not body.strip() else exc.colno}",
                                   status=400) from None
    if _depth(data) > MAX_DEPTH:
        raise errors.MalformedBody(f"{SYNTAX}: recursion limit exceeded", status=400)
    if not isinstance(data, dict):
        raise errors.MalformedBody(
            f"{DATA}: invalid type: {_kind(data)}, expected struct {model.__name__}",
            status=422)
    if data.get("parameters", 0) is None:
        del data["parameters"]  # read as absent (TGI: default_parameters())
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise errors.MalformedBody(f"{DATA}: {_serde_text(exc)}", status=422,
                                   field=_path(exc.errors()[0]["loc"]) or None) from None


def json_media_type(value: str | None) -> bool:
    """axum json.rs `json_content_type`: type `application`, subtype `json` or suffix `+json`."""
    if value is None:
        return True  # the deviation in the module docstring
    mime = value.split(";", 1)[0].strip().lower()
    kind, _, sub = mime.partition("/")
    return kind == "application" and (sub == "json" or sub.endswith("+json"))


def _depth(data: Any) -> int:
    depth, level = 0, [data]
    while level:
        depth += 1
        nxt: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                nxt.extend(item.values())
            elif isinstance(item, list):
                nxt.extend(item)
        level = [x for x in nxt if isinstance(x, dict | list)]
        if depth > MAX_DEPTH:
            break
    return depth


def _kind(value: Any) -> str:
    """serde's `Unexpected` names for a JSON value."""
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, str):
        return f"string {orjson.dumps(value).decode()}"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    return "null"


def _path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _serde_text(exc: ValidationError) -> str:
    """serde_path_to_error's "path: message" for the first error, in serde's words where
    pydantic's error type maps onto one."""
    first = exc.errors()[0]
    loc = tuple(first.get("loc", ()))
    if first["type"] == "missing":
        where = _path(loc[:-1])
        text = f"missing field `{loc[-1]}`"
        return f"{where}: {text}" if where else text
    # serde: "invalid type" when the JSON kind is wrong, "invalid value" when it is out of range.
    out_of_range = first["type"].startswith(("greater", "less", "too_", "literal", "enum"))
    what = "value" if out_of_range else "type"
    return f"{_path(loc)}: invalid {what}: {_kind(first.get('input'))}, {first['msg'].lower()}"
