"""Elastic client protocol: Elasticsearch's inference API, served as Elasticsearch serves it.

Chat (seed 004): POST _inference/{id}/_unified, _inference/chat_completion/{id}/_unified and
the same with _stream. The answer always streams, whatever the path says. The completion task:
POST _inference/completion/{id} (JSON) and .../_stream. `{id}` is the inference endpoint: a
gateway model name or alias. Requests are checked as Elasticsearch's parsers check them (unknown
fields refused, its messages and exception types); errors take its forms (elastic_encode).

The body's `model` is accepted and not used: the path's `{id}` already picks the gateway model,
and that model's configured `upstream_model` is what the worker is asked for. In Elasticsearch
`model` overrides the provider model id inside one endpoint (OpenAiChatCompletionModel.of);
here that id is the operator's config, and a worker serves only what it loaded (seed 004's own
example sends "gpt-4o", which a vLLM worker would refuse).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from adapters import base, validation
from adapters.frontends import elastic_encode as enc
from schemas import canonical, errors
from schemas import elastic as wire

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

# Completion task settings of Elasticsearch's services that mean something to the gateway:
# openai's `user`, anthropic's sampling settings.
_TASK_SETTINGS = ("user", "temperature", "top_p", "top_k", "max_tokens")


class ElasticChatFrontend:
    """The unified chat completion API; `framing` is the gateway's `elastic.framing`, noted at
    each parse because render_error has no request to read it from (it is gateway-wide).
    `stream` False: POST _inference/chat_completion/{id} without `_stream`, a whole JSON
    answer (Elasticsearch 9.6, PR #158022)."""

    def __init__(self, framing: enc.Framing = "documented", stream: bool = True):
        self.framing: enc.Framing = framing
        self.stream = stream

    def parse(self, body: bytes, ctx: base.RequestContext) -> canonical.InferenceRequest:
        name, self.framing = _inference_id(ctx)
        raw = _load(wire.UnifiedRequest, body, ctx, CHAT_PARSER)
        if not raw.messages:
            raise _validation_failed("Field [messages] cannot be an empty array")
        req = canonical.InferenceRequest(
            model=_endpoint(ctx, name),
            messages=[_message(m, i) for i, m in enumerate(raw.messages)],
            sampling=canonical.Sampling(max_tokens=raw.max_completion_tokens,
                                        temperature=raw.temperature, top_p=raw.top_p,
                                        stop=list(raw.stop or [])),
            # Seed 004: the _stream and _unified routes stream; Elasticsearch asks its provider
            # for usage and ends with a usage chunk (OpenAiUnifiedChatCompletionRequestEntity).
            stream=self.stream, include_usage=True,
            client_state=enc.ElasticState(self.framing, _response_type(ctx)))
        if raw.tools:
            req.tools = [canonical.ToolSpec(t.function.name, t.function.description,
                                            t.function.parameters, t.function.strict)
                         for t in raw.tools]
        if isinstance(raw.tool_choice, wire.ToolChoiceObject):
            req.tool_choice = raw.tool_choice.function.name
        else:
            req.tool_choice = raw.tool_choice
        return req

    def encoder(self, req: canonical.InferenceRequest,
                meta: base.ResponseMeta) -> base.StreamEncoder:
        return enc.ChatStreamEncoder(meta, _framing(req, meta))

    def render(self, req: canonical.InferenceRequest, done: canonical.Completion,
               meta: base.ResponseMeta) -> base.Rendered:
        """The non-streaming chat completion (ChatCompletionChunkResponse, `message`)."""
        state = req.client_state if isinstance(req.client_state, enc.ElasticState) \
            else enc.ElasticState()
        return base.Rendered(200, orjson.dumps(enc.chat_body(done, meta)), state.media_type,
                             dict(enc.PRODUCT_HEADERS))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        if not self.stream:
            return enc.render_unified_json_error(exc)
        return enc.render_stream_error(exc, self.framing, unified=True)


class ElasticCompletionFrontend:
    """The completion task: `{"input": ...}` as one user turn; JSON or, on _stream, SSE."""

    def __init__(self, stream: bool = False, framing: enc.Framing = "documented"):
        self.stream = stream
        self.framing: enc.Framing = framing

    def parse(self, body: bytes, ctx: base.RequestContext) -> canonical.InferenceRequest:
        name, self.framing = _inference_id(ctx)
        raw = _load(wire.CompletionRequest, body, ctx, COMPLETION_PARSER)
        inputs = raw.input
        if inputs is None:
            raise _validation_failed("Field [input] cannot be null")
        if not inputs:
            raise _validation_failed("Field [input] cannot be an empty array")
        for key in ("return_documents", "top_n", "input_type"):
            if getattr(raw, key) is not None:
                raise _validation_failed(
                    f"Field [{key}] cannot be specified for task type [completion]")
        if len(inputs) > 1:  # OpenAiActionCreator: "OpenAI completions only accepts 1 input"
            raise enc.tag(errors.InvalidRequest("completion only accepts 1 input",
                                                field="input"), "status_exception")
        req = canonical.InferenceRequest(
            model=_endpoint(ctx, name),
            messages=[canonical.Message("user", inputs[0])], stream=self.stream,
            client_state=enc.ElasticState(self.framing, _response_type(ctx)))
        _task_settings(req, raw.task_settings or {})
        return req

    def encoder(self, req: canonical.InferenceRequest,
                meta: base.ResponseMeta) -> base.StreamEncoder:
        return enc.CompletionStreamEncoder(_framing(req, meta))

    def render(self, req: canonical.InferenceRequest, done: canonical.Completion,
               meta: base.ResponseMeta) -> base.Rendered:
        state = req.client_state if isinstance(req.client_state, enc.ElasticState) \
            else enc.ElasticState()
        return base.Rendered(200, orjson.dumps(enc.completion_body(done)), state.media_type,
                             dict(enc.PRODUCT_HEADERS))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        if self.stream:
            return enc.render_stream_error(exc, self.framing, unified=False)
        return enc.render_json_error(exc)


def _inference_id(ctx: base.RequestContext) -> tuple[str | None, enc.Framing]:
    """The path's inference id and the framing its model's options (else the default model's:
    the setting is gateway-wide) ask for."""
    name = ctx.path_params.get("id")
    return name, enc.framing_of(ctx.model_options(name) or ctx.model_options(None))


def _framing(req: canonical.InferenceRequest, meta: base.ResponseMeta) -> enc.Framing:
    """`elastic.framing` from the serving model's options; else what parse noted."""
    if meta.options.get("elastic"):
        return enc.framing_of(meta.options)
    state = req.client_state
    return state.framing if isinstance(state, enc.ElasticState) else "documented"


def _endpoint(ctx: base.RequestContext, name: str | None) -> str:
    """The model the path names; unknown: TransportInferenceAction's 404."""
    if not name or not ctx.model_options(name):
        raise enc.tag(errors.ModelNotFound(f"Inference endpoint not found [{name or ''}]"),
                      "resource_not_found_exception")
    return name


def _load(model: type[validation.M], body: bytes, ctx: base.RequestContext,
          parser: str) -> validation.M:
    """The body, checked first as RestController checks it (Content-Type, a body at all), then
    as the action's object parser does (JSON, fields, their types)."""
    ctype = ctx.headers.get("content-type", "").strip()
    if ctype and ctype.split(";", 1)[0].strip().lower() not in JSON_TYPES:
        raise enc.tag(errors.InvalidRequest(f"Content-Type header [{ctype}] is not supported",
                                            status=406), "", rest=True)
    if not body.strip():  # RestRequest.requiredContent()
        raise enc.tag(errors.InvalidRequest("request body is required"), "parse_exception",
                      rest=True)
    try:
        data = validation.load_object(body)
    except errors.InvalidRequest as exc:
        raise enc.tag(exc, "x_content_parse_exception") from None
    _check_fields(data, parser)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _parse_error(exc, parser) from None


def _check_fields(data: dict[str, Any], parser: str) -> None:
    """ObjectParser's own checks, in document order: an unknown field, a value of a JSON type
    the field does not take; an array field given one item gets it as a list of one."""
    fields = _FIELDS[parser]
    for key, value in data.items():
        if key not in fields:
            raise enc.tag(errors.InvalidRequest(f"[{parser}] unknown field [{key}]", field=key),
                          "x_content_parse_exception")
        tokens, array = fields[key]
        token = _token(value)
        if value is None:
            continue
        if token not in tokens:
            raise enc.tag(errors.InvalidRequest(
                f"[{parser}] {key} doesn't support values of type: {token}", field=key),
                "x_content_parse_exception")
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


def _parse_error(exc: ValidationError, parser: str) -> errors.GatewayError:
    """ObjectParser's `[parser] failed to parse field [f]` for anything wrong inside a field
    (an unknown nested field too: the nested parser's own message is only its cause), and
    ConstructingObjectParser's `Required [f]`. Jackson's `[line:col] ` location prefix is not
    reproduced; `param` names the exact place instead."""
    first = exc.errors()[0]
    loc = [p for p in first.get("loc", ()) if isinstance(p, int) or _is_field(p)]
    top = str(loc[0]) if loc else ""
    param = _dotted(loc) or None
    if len(loc) == 1 and first["type"] == "missing":
        return enc.tag(errors.InvalidRequest(f"Required [{top}]", field=param),
                       "illegal_argument_exception")
    return enc.tag(errors.InvalidRequest(f"[{parser}] failed to parse field [{top}]",
                                         field=param), "x_content_parse_exception")


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


def _validation_failed(message: str) -> errors.GatewayError:
    """ActionRequestValidationException's message form."""
    return enc.tag(errors.InvalidRequest(f"Validation Failed: 1: {message};"),
                   "action_request_validation_exception")


def _message(m: wire.Message, i: int) -> canonical.Message:
    """One turn; content parts keep their `type` and `text` as given."""
    if m.content is None and not (m.role == "assistant" and m.tool_calls):
        raise enc.tag(errors.InvalidRequest(f"[{CHAT_PARSER}] failed to parse field [messages]",
                                            field=f"messages[{i}].content"),
                      "x_content_parse_exception")
    content: str | list[canonical.ContentPart] | None
    if isinstance(m.content, list):
        content = [{"type": p.type, "text": p.text} for p in m.content]
    else:
        content = m.content
    calls = None
    if m.tool_calls is not None:
        calls = [canonical.ToolCall(c.id, c.function.name, c.function.arguments)
                 for c in m.tool_calls]
    return canonical.Message(role=m.role, content=content, tool_calls=calls,
                             tool_call_id=m.tool_call_id)


def _task_settings(req: canonical.InferenceRequest, settings: dict[str, Any]) -> None:
    """Per-request task settings; one this gateway does not know is refused, as a service
    refuses settings unknown to it (ServiceUtils.throwIfNotEmptyMap)."""
    unknown = {k: v for k, v in settings.items() if k not in _TASK_SETTINGS}
    if unknown:
        shown = ", ".join(f"{k}={v}" for k, v in unknown.items())
        raise enc.tag(errors.InvalidRequest(
            f"Model configuration contains settings [{{{shown}}}] unknown to the [gateway] "
            "service", field="task_settings"), "status_exception")
    try:
        checked = _TaskSettings.model_validate(settings)
    except ValidationError as exc:
        raise enc.tag(validation.as_invalid_request(exc), "status_exception") from None
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


def _response_type(ctx: base.RequestContext) -> str:
    """Elasticsearch answers in the compatible-with media type a client asked for."""
    for header in ("accept", "content-type"):
        value = ctx.headers.get(header, "")
        if value.startswith("application/vnd.elasticsearch+json"):
            version = value.partition("compatible-with=")[2].strip()
            return f"application/vnd.elasticsearch+json;compatible-with={version}" if version \
                else "application/vnd.elasticsearch+json"
    return enc.JSON_MEDIA_TYPE
