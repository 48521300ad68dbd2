"""Elastic request checks, as Elasticsearch makes them before its inference action runs.

RestController first (a supported Content-Type, a body at all: errors of its REST layer, JSON),
then the action's ObjectParser (JSON, known fields, each field's JSON token types, a lone item
for an array field) and pydantic for what lies inside a field. Each refusal is raised from an
`EsNote` naming the Elasticsearch exception it stands for (elastic_encode).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, NoReturn

import orjson
from pydantic import BaseModel, ValidationError

from adapters import base, validation
from adapters.frontends.elastic_encode import JSON_MEDIA_TYPE, EsNote
from schemas import canonical, errors

# The parser names Elasticsearch puts in its messages: UnifiedCompletionRequest.PARSER
# (the class's simple name) and InferenceAction.Request.PARSER (the action's NAME).
CHAT_PARSER = "UnifiedCompletionRequest"
COMPLETION_PARSER = "cluster:internal/xpack/inference"

# Content types Elasticsearch reads as JSON: plain, and the compatible-with form its clients
# send (elasticsearch-py `_COMPAT_MIMETYPE_TEMPLATE`, wire-formats.md 7.6).
JSON_TYPES = ("application/json", "application/vnd.elasticsearch+json")

# Completion task settings of Elasticsearch's services that mean something to the gateway:
# openai's `user`, anthropic's sampling settings.
_TASK_SETTINGS = ("user", "temperature", "top_p", "top_k", "max_tokens")

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


def content_type(headers: Mapping[str, str]) -> None:
    """RestController's first check, before any handler runs: a supported Content-Type."""
    ctype = headers.get("content-type", "").strip()
    if ctype and ctype.split(";", 1)[0].strip().lower() not in JSON_TYPES:
        raise errors.InvalidRequest(f"Content-Type header [{ctype}] is not supported",
                                    status=406) from EsNote(rest=True)


def rest(body: bytes, headers: Mapping[str, str]) -> None:
    """RestController's checks, before any action runs: a supported Content-Type, a body."""
    content_type(headers)
    if not body.strip():  # RestRequest.requiredContent()
        raise errors.InvalidRequest("request body is required") \
            from EsNote("parse_exception", rest=True)


def load(model: type[validation.M], body: bytes, headers: Mapping[str, str],
         parser: str) -> validation.M:
    """The body, checked first as RestController checks it (Content-Type, a body at all), then
    as the action's object parser does (JSON, fields, their types)."""
    rest(body, headers)
    try:
        data = validation.load_object(body)
    except errors.InvalidRequest as exc:
        raise exc from EsNote("x_content_parse_exception")
    _check_fields(data, body, parser)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        _parse_error(exc, body, parser)


def _check_fields(data: dict[str, Any], body: bytes, parser: str) -> None:
    """ObjectParser's own checks, in document order: an unknown field (located at its name), a
    value of a JSON type the field does not take (at the value); an array field given one item
    gets it as a list of one."""
    fields = _FIELDS[parser]
    for key, value in data.items():
        if key not in fields:
            raise errors.InvalidRequest(
                f"{_at(body, key, 0)}[{parser}] unknown field [{key}]{_suggest(key, fields)}",
                field=key) from EsNote("x_content_parse_exception")
        tokens, array = fields[key]
        token = _token(value)
        if value is None:
            continue
        if token not in tokens:
            raise errors.InvalidRequest(
                f"{_at(body, key, 1)}[{parser}] {key} doesn't support values of type: {token}",
                field=key) from EsNote("x_content_parse_exception")
        if array and token != "START_ARRAY":
            data[key] = [value]


def _suggest(name: str, known: Iterable[str]) -> str:
    """SuggestingErrorOnUnknown.suggest: the parser's fields whose Lucene LevenshteinDistance
    (1 - edits / the longer length) is above 0.5, closest first, then by name."""
    scored = sorted((Fraction(d, n), k) for k in known
                    if 2 * (d := _edits(name, k)) < (n := max(len(name), len(k))))
    keys = [k for _, k in scored]
    if not keys:
        return ""
    return f" did you mean [{keys[0]}]?" if len(keys) == 1 else \
        f" did you mean any of [{', '.join(keys)}]?"


def _edits(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions, each 1."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


# A JSON token: a string, a structural character, or the bytes of a number / true / false / null.
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


def _at(body: bytes, key: str, part: int) -> str:
    """XContentParseException's `[line:column] ` prefix for a top-level field of a valid JSON
    object body: the location Jackson gives the field's name token (`part` 0, its opening
    quote) or the first token of its value (1). UTF8StreamJsonParser counts both from 1, the
    column in bytes from the line's start (`_updateNameLocation` / `_updateLocation`: the input
    pointer after the token's first byte, less `_currInputRowStart`); a line ends at \\n, \\r
    or \\r\\n, which valid JSON has only between tokens."""
    offset = _members(body)[key][part]
    head = body[:offset]
    line = 1 + head.count(b"\n") + head.count(b"\r") - head.count(b"\r\n")
    column = offset - max(head.rfind(b"\n"), head.rfind(b"\r"))
    return f"[{line}:{column}] "


def _members(body: bytes) -> dict[str, tuple[int, int]]:
    """Each top-level field's byte offsets: its name's opening quote, its value's first byte."""
    out: dict[str, tuple[int, int]] = {}
    depth, expect_name, name = 0, False, None
    for m in _JSON_TOKEN.finditer(body):
        tok = m.group()
        if name is not None and tok != b":":
            out.setdefault(name[0], (name[1], m.start()))
            name = None
        if tok in (b"{", b"["):
            depth += 1
            expect_name = depth == 1
        elif tok in (b"}", b"]"):
            depth -= 1
        elif depth == 1 and tok == b",":
            expect_name = True
        elif expect_name:
            name, expect_name = (orjson.loads(tok), m.start()), False
    return out


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


def _parse_error(exc: ValidationError, body: bytes, parser: str) -> NoReturn:
    """ObjectParser's `[parser] failed to parse field [f]` for anything wrong inside a field
    (an unknown nested field too: the nested parser's own message is only its cause), and
    ConstructingObjectParser's `Required [f]` (an IllegalArgumentException: no location).
    Jackson's `[line:col] ` prefix is the parser's token when the field's parser failed: the
    value itself for a top-level scalar; inside an array or object it is wherever the nested
    parser stopped, which is not reproduced (no prefix there)."""
    first = exc.errors()[0]
    loc = [p for p in first.get("loc", ()) if isinstance(p, int) or _is_field(p)]
    top = str(loc[0]) if loc else ""
    param = _dotted(loc) or None
    if len(loc) == 1 and first["type"] == "missing":
        raise errors.InvalidRequest(f"Required [{top}]", field=param) \
            from EsNote("illegal_argument_exception")
    scalar = len(loc) == 1 and not isinstance(first.get("input"), dict | list)
    at = _at(body, top, 1) if scalar else ""
    raise errors.InvalidRequest(f"{at}[{parser}] failed to parse field [{top}]", field=param) \
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
    """ActionRequestValidationException's message form. TransportAction.execute runs
    `validate()` and hands its failure to the caller's listener, outside the chat routes'
    unified-error wrapper (TransportInferenceActionProxy.sendUnifiedCompletionRequest wraps
    only what parsing throws): ES's generic error form on every route."""
    raise errors.InvalidRequest(f"Validation Failed: 1: {message};") \
        from EsNote("action_request_validation_exception", generic=True)


def response_type(ctx: base.RequestContext) -> str:
    """Elasticsearch answers in the compatible-with media type a client asked for."""
    for header in ("accept", "content-type"):
        value = ctx.headers.get(header, "")
        if value.startswith("application/vnd.elasticsearch+json"):
            version = value.partition("compatible-with=")[2].strip()
            return f"application/vnd.elasticsearch+json;compatible-with={version}" if version \
                else "application/vnd.elasticsearch+json"
    return JSON_MEDIA_TYPE


def task_settings(req: canonical.InferenceRequest, settings: dict[str, Any]) -> None:
    """Per-request task settings; one this gateway does not know is refused, as a service
    refuses settings unknown to it (ServiceUtils.throwIfNotEmptyMap)."""
    unknown = {k: v for k, v in settings.items() if k not in _TASK_SETTINGS}
    if unknown:
        shown = ", ".join(f"{k}={v}" for k, v in unknown.items())
        raise errors.InvalidRequest(
            f"Model configuration contains settings [{{{shown}}}] unknown to the [gateway] "
            "service", field="task_settings") from EsNote("status_exception")
    try:
        checked = _TaskSettings.model_validate(settings)
    except ValidationError as exc:
        raise validation.as_invalid_request(exc) from EsNote("status_exception")
    req.user = checked.user
    s = req.sampling
    s.temperature, s.top_p, s.top_k, s.max_tokens = (
        checked.temperature, checked.top_p, checked.top_k, checked.max_tokens)


class _TaskSettings(BaseModel):
    user: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
