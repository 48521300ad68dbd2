"""Turning request bytes into validated wire models, with errors that name the field."""

from __future__ import annotations

from typing import Any, TypeVar, cast

import orjson
from pydantic import BaseModel, ValidationError

from schemas import errors

M = TypeVar("M", bound=BaseModel)


def load_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or InvalidRequest."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise errors.InvalidRequest(f"Request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise errors.InvalidRequest("Request body must be a JSON object")
    return data


def validate(model: type[M], data: dict[str, Any]) -> M:
    """`model.model_validate` with pydantic's first error turned into InvalidRequest. The
    model's own validator is called: `model_validate` is a Python frame that passes it seven
    keyword arguments, all None (about a twentieth of parsing a chat request)."""
    try:
        return cast(M, model.__pydantic_validator__.validate_python(data))
    except ValidationError as exc:
        raise as_invalid_request(exc) from None


def as_invalid_request(exc: ValidationError) -> errors.InvalidRequest:
    """The one place pydantic errors become gateway errors: "`field.path`: message"."""
    first = exc.errors()[0]
    loc = dotted(first.get("loc", ()))
    msg = first.get("msg", "is invalid")
    text = f"`{loc}`: {msg}" if loc else str(msg)
    more = len(exc.errors()) - 1
    if more:
        text += f" (and {more} more error{'s' if more > 1 else ''})"
    return errors.InvalidRequest(text, field=loc or None)


def dotted(loc: tuple[object, ...] | Any) -> str:
    """`messages[0].role`; the union member pydantic tried is not a place in the body (a
    `stop` of neither type is `stop`, as OpenAI's `param` names it, not `stop.str`)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _union_member(str(part)):
            break
        else:
            out += ("." if out else "") + str(part)
    return out


# Names pydantic gives union members in an error's `loc`: a type (`str`, `list[str]`,
# `literal['auto']`, `function-after[...]`, a bounded `constrained-int`) or a model class
# (`NamedToolChoice`).
_TYPE_NAMES = frozenset(("str", "int", "float", "bool", "bytes", "dict", "list", "none"))


def _union_member(part: str) -> bool:
    return (part in _TYPE_NAMES or "[" in part or part[:1].isupper()
            or part.startswith("constrained-"))
