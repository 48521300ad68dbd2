"""Elastic request checks, as Elasticsearch makes them before its inference action runs.

RestController first (a supported Content-Type, a body at all: errors of its REST layer, JSON),
then the action's ObjectParser (JSON, known fields, each field's JSON token types, a lone item
for an array field) and pydantic for what lies inside a field. Each refusal is raised from an
`EsNote` naming the Elasticsearch exception it stands for (elastic_encode).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from pydantic import ValidationError

from adapters import validation
from adapters.frontends.elastic_encode import EsNote
from schemas import errors

# The parser names Elasticsearch puts in its messages: UnifiedCompletionRequest.PARSER
# (the class's simple name) and InferenceAction.Request.PARSER (the action's NAME).
CHAT_PARSER = "UnifiedCompletionRequest"
COMPLETION_PARSER = "cluster:internal/xpack/inference"

# Content types Elasticsearch reads as JSON: plain, and the compatible-with form its clients
# send (elasticsearch-py `_COMPAT_MIMETYPE_TEMPLATE`, wire-formats.md 7.6).
JSON_TYPES = ("application/json", "application/vnd.elasticsearch+json")

# Each top-level field's ObjectParser.ValueType: the JSON tokens it takes, and whether it is an
# array field (which also takes one bare item as a list of one). A JSON null is read as absent
# here, where Elasticsearch refuses it.
_STRING = ("VALUE_STRING",), False
_NUMBER = ("VALUE_NUMBER", "VALUE_STRING"), False  # declareFloat/Long/Int take "0.5" too
_FIELDS: dict[str, dict[str, tuple[tuple[str, ...], bool]]] = {
    CHAT_PARSER: {
        "messages": (("START_ARRAY", "START_OBJECT"), True), "model": _STRING,
        "max_completion_tokens": _NUMBER, "stop": (("START_ARRAY", "VALUE_STRING"), True),
        "temperature": _NUMBER, "tool_choice": (("START_OBJECT", "VALUE_STRING"), False),
        "tools": (("START_ARRAY", "START_OBJECT"), True), "top_p": _NUMBER,
    },
    COMPLETION_PARSER: {
        "input": (("START_ARRAY", "VALUE_STRING"), True), "input_type": _STRING,
        "task_settings": (("START_OBJECT",), False), "query": _STRING,
        "return_documents": (("VALUE_BOOLEAN", "VALUE_STRING"), False), "top_n": _NUMBER,
        "timeout": _STRING,
    },
}


def load(model: type[validation.M], body: bytes, headers: Mapping[str, str],
         parser: str) -> validation.M:
    """The body, checked first as RestController checks it (Content-Type, a body at all), then
    as the action's object parser does (JSON, fields, their types)."""
    ctype = headers.get("content-type", "").strip()
    if ctype and ctype.split(";", 1)[0].strip().lower() not in JSON_TYPES:
        raise errors.InvalidRequest(f"Content-Type header [{ctype}] is not supported",
                                    status=406) from EsNote(rest=True)
    if not body.strip():  # RestRequest.requiredContent()
        raise errors.InvalidRequest("request body is required") \
            from EsNote("parse_exception", rest=True)
    try:
        data = validation.load_object(body)
    except errors.InvalidRequest as exc:
        raise exc from EsNote("x_content_parse_exception")
    _check_fields(data, parser)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        _parse_error(exc, parser)


def _check_fields(data: dict[str, Any], parser: str) -> None:
    """ObjectParser's own checks, in document order: an unknown field, a value of a JSON type
    the field does not take; an array field given one item gets it as a list of one."""
    fields = _FIELDS[parser]
    for key, value in data.items():
        if key not in fields:
            raise errors.InvalidRequest(f"[{parser}] unknown field [{key}]", field=key) \
                from EsNote("x_content_parse_exception")
        tokens, array = fields[key]
        token = _token(value)
        if value is None:
            continue
        if token not in tokens:
            raise errors.InvalidRequest(
                f"[{parser}] {key} doesn't support values of type: {token}", field=key) \
                from EsNote("x_content_parse_exception")
        if array and token != "START_ARRAY":
            data[key] = [value]


def _token(value: Any) -> str:
    """The Jackson token a JSON value starts with."""
    if isinstance(value, bool):
        return "VALUE_BOOLEAN"
    if isinstance(value, int | float):
        return "VALUE_NUMBER"
    if isinstance(value, str):
        return "VALUE_STRING"
    if isinstance(value, list):
        return "START_ARRAY"
    return "START_OBJECT" if isinstance(value, dict) else "VALUE_NULL"


def _parse_error(exc: ValidationError, parser: str) -> NoReturn:
    """ObjectParser's `[parser] failed to parse field [f]` for anything wrong inside a field
    (an unknown nested field too: the nested parser's own message is only its cause), and
    ConstructingObjectParser's `Required [f]`. Jackson's `[line:col] ` location prefix is not
    reproduced; `param` names the exact place instead."""
    first = exc.errors()[0]
    loc = [p for p in first.get("loc", ()) if isinstance(p, int) or _is_field(p)]
    top = str(loc[0]) if loc else ""
    param = _dotted(loc) or None
    if len(loc) == 1 and first["type"] == "missing":
        raise errors.InvalidRequest(f"Required [{top}]", field=param) \
            from EsNote("illegal_argument_exception")
    raise errors.InvalidRequest(f"[{parser}] failed to parse field [{top}]", field=param) \
        from EsNote("x_content_parse_exception")


def _is_field(part: Any) -> bool:
    """Pydantic puts union members in `loc` ("str", "literal[...]", "ToolChoiceObject");
    the wire models' field names are lower-case identifiers."""
    return isinstance(part, str) and part.isidentifier() and part[:1].islower() \
        and part not in ("str", "int", "float", "bool", "dict", "list")


def _dotted(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def validation_failed(message: str) -> NoReturn:
    """ActionRequestValidationException's message form."""
    raise errors.InvalidRequest(f"Validation Failed: 1: {message};") \
        from EsNote("action_request_validation_exception")
