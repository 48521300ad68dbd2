"""Elastic client protocol: Elasticsearch's inference API, served as Elasticsearch serves it.

Chat (seed 004): POST _inference/{id}/_unified, _inference/chat_completion/{id}/_unified and
the same with _stream. The answer always streams, whatever the path says. The completion task:
POST _inference/completion/{id} (JSON) and .../_stream. POST _inference/{id}: the completion
task for a body with `input`, else a whole chat completion. `{id}` is the inference endpoint: a
gateway model name or alias; on a path without a task type it is looked up before the body is
read, as Elasticsearch does. Requests are checked as Elasticsearch's parsers check them (unknown
fields refused, its messages and exception types); errors take its forms (elastic_encode).

The body's `model` is accepted and not used: the path's `{id}` already picks the gateway model,
and that model's configured `upstream_model` is what the worker is asked for. In Elasticsearch
`model` overrides the provider model id inside one endpoint (OpenAiChatCompletionModel.of);
here that id is the operator's config, and a worker serves only what it loaded (seed 004's own
example sends "gpt-4o", which a vLLM worker would refuse).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import orjson

from adapters import base
from adapters.frontends import elastic_encode as enc
from adapters.frontends import elastic_endpoints as endpoints
from adapters.frontends import elastic_parse as check
from adapters.frontends.elastic_parse import CHAT_PARSER, COMPLETION_PARSER
from schemas import canonical, errors
from schemas import elastic as wire


@dataclass(slots=True)
class ChatTranslator:
    """One unified chat completion: streamed in the framing of the gateway's `elastic` options,
    or (`stream` False) one JSON answer in the media type asked for."""

    request: canonical.InferenceRequest
    state: enc.ElasticState
    stream: bool = True

    def encoder(self, meta: base.ResponseMeta) -> base.StreamEncoder:
        return enc.ChatStreamEncoder(meta, self.state.framing)

    def render(self, done: canonical.Completion, meta: base.ResponseMeta) -> base.Rendered:
        """The non-streaming chat completion (ChatCompletionChunkResponse, `message`)."""
        return base.Rendered(200, orjson.dumps(enc.chat_body(done, meta)), self.state.media_type,
                             dict(enc.PRODUCT_HEADERS))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        if not self.stream:
            return enc.render_unified_json_error(exc)
        return enc.render_stream_error(exc, self.state.framing, unified=True)


@dataclass(slots=True)
class CompletionTranslator:
    """One completion task request: JSON (in the media type asked for) or, on _stream, SSE."""

    request: canonical.InferenceRequest
    state: enc.ElasticState
    stream: bool

    def encoder(self, meta: base.ResponseMeta) -> base.StreamEncoder:
        return enc.CompletionStreamEncoder(self.state.framing)

    def render(self, done: canonical.Completion, meta: base.ResponseMeta) -> base.Rendered:
        return base.Rendered(200, orjson.dumps(enc.completion_body(done)), self.state.media_type,
                             dict(enc.PRODUCT_HEADERS))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        if self.stream:
            return enc.render_stream_error(exc, self.state.framing, unified=False)
        return enc.render_json_error(exc)


class ElasticChatFrontend:
    """The unified chat completion API. `framing` frames the errors that come before a request
    names its model (parse notes the request's own on a refusal: enc.EsNote). `stream` False:
    POST _inference/chat_completion/{id} without `_stream`, a whole JSON answer
    (Elasticsearch 9.6, PR #158022). `lookup_first`: a path without a task type (TaskType.ANY),
    whose endpoint Elasticsearch looks up before it reads the body."""

    def __init__(self, framing: enc.Framing = "documented", stream: bool = True,
                 lookup_first: bool = False):
        self.framing: Final[enc.Framing] = framing
        self.stream: Final = stream
        self.lookup_first: Final = lookup_first

    def parse(self, body: bytes, ctx: base.RequestContext) -> base.Translator:
        return ChatTranslator(*_parsed(_chat_request, body, ctx, self.stream, self.lookup_first),
                              self.stream)

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        if not self.stream:
            return enc.render_unified_json_error(exc)
        framing = enc.refusal_framing(exc, self.framing)
        return enc.render_stream_error(exc, framing, unified=True)


class ElasticChatWholeFrontend(ElasticChatFrontend):
    """POST _inference/chat_completion/{id}: the non-streaming chat completion."""

    def __init__(self) -> None:
        super().__init__(stream=False)


class ElasticAnyTaskChatFrontend(ElasticChatFrontend):
    """POST _inference/{id}/_stream and _unified: no task type in the path."""

    def __init__(self) -> None:
        super().__init__(lookup_first=True)


class ElasticAnyTaskStreamFrontend(ElasticAnyTaskChatFrontend):
    """POST _inference/{id}/_stream: the endpoint's stored task decides
    (TransportInferenceActionProxy.doExecute, TaskType.ANY). A gateway model serves both text
    tasks, so a body with `input` gets the completion task's stream, as on
    _inference/completion/{id}/_stream (elasticsearch-py `inference.stream_inference`
    without a task type), and any other body the unified chat stream."""

    def parse(self, body: bytes, ctx: base.RequestContext) -> base.Translator:
        if _names_input(body):
            return CompletionTranslator(
                *_parsed(_completion_request, body, ctx, True, True, generic=True), True)
        return super().parse(body, ctx)


def _names_input(body: bytes) -> bool:
    """Whether the body is a JSON object with `input`: the completion task's request. A body
    without the bytes `"input"` is not one, so a chat request is not decoded twice."""
    if b'"input"' not in body:
        return False
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(data, dict) and "input" in data


class ElasticInferenceFrontend:
    """POST _inference/{id} (RestInferenceAction's INFERENCE_ID_PATH; elasticsearch-py's
    `inference.inference`): the endpoint is looked up first and its stored task type decides
    (TransportInferenceActionProxy.doExecute, TaskType.ANY). A gateway model serves both text
    tasks, so a body with `input` is the completion task, answered as on
    _inference/completion/{id}; any other body is what a chat_completion endpoint gets there,
    a unified request (sendUnifiedCompletionRequest) answered whole, as on
    _inference/chat_completion/{id} (Elasticsearch 9.6, PR #158022)."""

    def parse(self, body: bytes, ctx: base.RequestContext) -> base.Translator:
        if _names_input(body):
            # The completion task answers every error in ES's generic form.
            return CompletionTranslator(
                *_parsed(_completion_request, body, ctx, False, True, generic=True), False)
        return ChatTranslator(*_parsed(_chat_request, body, ctx, False, True), False)

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        """The chat task's refusals (parse notes the framing, not `generic`) in the unified
        form; the rest, before any task was picked too, in ES's generic one (RestInferenceAction
        .sendFailure: not an XContentFormattedException)."""
        note = base.note_of(exc, enc.EsNote)
        if note is not None and note.framing is not None and not note.generic:
            return enc.render_unified_json_error(exc)
        return enc.render_json_error(exc)


class ElasticTaskTypeFrontend(ElasticInferenceFrontend):
    """POST _inference/{task_type}/{id} for a path no other route takes (RestInferenceAction's
    TASK_TYPE_INFERENCE_ID_PATH): the task type is parsed as TaskType.fromStringOrStatusException
    parses it (any case; unknown: a 400 before the body is read). `completion`,
    `chat_completion` and `any` are served as on their own paths; for any other task the body
    is read and checked (InferenceAction.Request.PARSER, validate()), the endpoint looked up
    (unknown: 404), and the task found not to be the endpoint's
    (BaseTransportInferenceAction.requestModelTaskTypeMismatchException)."""

    def parse(self, body: bytes, ctx: base.RequestContext) -> base.Translator:
        name, framing = _inference_id(ctx)
        try:
            check.content_type(ctx.headers)
            task = endpoints.task_type(ctx.path_params.get("task_type", ""))
        except errors.GatewayError as exc:
            raise exc from enc.framed(exc, framing, generic=True)
        if task == "any":
            return super().parse(body, ctx)
        if task == "completion":
            return CompletionTranslator(
                *_parsed(_completion_request, body, ctx, False, generic=True), False)
        if task == "chat_completion":
            return ChatTranslator(*_parsed(_chat_request, body, ctx, False), False)
        _parsed(functools.partial(_other_task_request, task), body, ctx, False, generic=True)
        raise AssertionError("unreachable: the request for another task is refused")


class ElasticCompletionFrontend:
    """The completion task: `{"input": ...}` as one user turn; JSON or, on _stream, SSE."""

    def __init__(self, stream: bool = False, framing: enc.Framing = "documented"):
        self.stream: Final = stream
        self.framing: Final[enc.Framing] = framing

    def parse(self, body: bytes, ctx: base.RequestContext) -> CompletionTranslator:
        return CompletionTranslator(*_parsed(_completion_request, body, ctx, self.stream),
                                    self.stream)

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        if self.stream:
            framing = enc.refusal_framing(exc, self.framing)
            return enc.render_stream_error(exc, framing, unified=False)
        return enc.render_json_error(exc)


class ElasticCompletionStreamFrontend(ElasticCompletionFrontend):
    """POST _inference/completion/{id}/_stream."""

    def __init__(self) -> None:
        super().__init__(stream=True)


RequestBuilder = Callable[[bytes, base.RequestContext, str | None, bool],
                         canonical.InferenceRequest]


def _parsed(build: RequestBuilder, body: bytes, ctx: base.RequestContext, stream: bool,
            lookup_first: bool = False, generic: bool = False
            ) -> tuple[canonical.InferenceRequest, enc.ElasticState]:
    """The request `build` makes of the body, and its Elastic state; a refusal carries the
    framing its error is rendered in (the path's, or the server's), and `generic` where the
    route answers every error in ES's generic form."""
    name, framing = _inference_id(ctx)
    try:
        if lookup_first:
            _lookup(body, ctx, name)
        req = build(body, ctx, name, stream)
    except errors.GatewayError as exc:
        raise exc from enc.framed(exc, framing, generic)
    return req, enc.ElasticState(framing, check.response_type(ctx))


def _lookup(body: bytes, ctx: base.RequestContext, name: str | None) -> None:
    """A path without a task type: after RestController's checks (BaseInferenceAction reads
    the body with requiredContent()), TransportInferenceActionProxy.doExecute asks the
    ModelRegistry for the endpoint before it parses the body, so an unknown id is a 404
    whatever the body, and it reaches the listener outside the unified-error wrapper."""
    check.rest(body, ctx.headers)
    try:
        _endpoint(ctx, name)
    except errors.ModelNotFound as exc:
        raise exc from enc.EsNote(generic=True)


def _chat_request(body: bytes, ctx: base.RequestContext, name: str | None,
                  stream: bool) -> canonical.InferenceRequest:
    raw = check.load(wire.UnifiedRequest, body, ctx.headers, CHAT_PARSER)
    if not raw.messages:
        check.validation_failed("Field [messages] cannot be an empty array")
    req = canonical.InferenceRequest(
        model=_endpoint(ctx, name),
        messages=[_message(m) for m in raw.messages],
        sampling=canonical.Sampling(max_tokens=raw.max_completion_tokens,
                                    temperature=raw.temperature, top_p=raw.top_p,
                                    stop=list(raw.stop or [])),
        # Seed 004: the _stream and _unified routes stream; Elasticsearch asks its provider
        # for usage and ends with a usage chunk (OpenAiUnifiedChatCompletionRequestEntity).
        stream=stream, include_usage=True)
    if raw.tools:
        req.tools = [canonical.ToolSpec(t.function.name, t.function.description,
                                        t.function.parameters, t.function.strict)
                     for t in raw.tools]
    if isinstance(raw.tool_choice, wire.ToolChoiceObject):
        req.tool_choice = raw.tool_choice.function.name
    else:
        req.tool_choice = raw.tool_choice
    return req


def _completion_request(body: bytes, ctx: base.RequestContext, name: str | None,
                        stream: bool) -> canonical.InferenceRequest:
    raw = check.load(wire.CompletionRequest, body, ctx.headers, COMPLETION_PARSER)
    inputs = raw.input
    if inputs is None:
        check.validation_failed("Field [input] cannot be null")
    if not inputs:
        check.validation_failed("Field [input] cannot be an empty array")
    for key in ("return_documents", "top_n", "input_type"):
        if getattr(raw, key) is not None:
            check.validation_failed(f"Field [{key}] cannot be specified for task type "
                                    "[completion]")
    if len(inputs) > 1:  # OpenAiActionCreator: "OpenAI completions only accepts 1 input"
        raise errors.InvalidRequest("completion only accepts 1 input", field="input") \
            from enc.EsNote("status_exception")
    req = canonical.InferenceRequest(
        model=_endpoint(ctx, name), messages=[canonical.Message("user", inputs[0])],
        stream=stream)
    check.task_settings(req, raw.task_settings or {})
    return req


def _other_task_request(task: str, body: bytes, ctx: base.RequestContext, name: str | None,
                        stream: bool) -> canonical.InferenceRequest:
    """A request for a task no gateway model serves: InferenceAction.Request's parser and
    validate(), the endpoint looked up, then refused as not of that task."""
    raw = check.load(wire.CompletionRequest, body, ctx.headers, COMPLETION_PARSER)
    if raw.input is None:
        check.validation_failed("Field [input] cannot be null")
    if not raw.input:
        check.validation_failed("Field [input] cannot be an empty array")
    if task == "rerank" and not raw.query:
        check.validation_failed(f"Field [query] cannot be {'null' if raw.query is None else 'empty'}"
                                " for task type [rerank]")
    for key in ("return_documents", "top_n") if task != "rerank" else ():
        if getattr(raw, key) is not None:
            check.validation_failed(f"Field [{key}] cannot be specified for task type [{task}]")
    _endpoint(ctx, name)
    raise errors.InvalidRequest(
        f"Incompatible task_type, the requested type [{task}] does not match the model type "
        f"[{endpoints.TASK}]") from enc.EsNote("status_exception", generic=True)


def _inference_id(ctx: base.RequestContext) -> tuple[str | None, enc.Framing]:
    """The path's inference id and the framing its model's options (else the default model's:
    the setting is gateway-wide) ask for."""
    name = ctx.path_params.get("id")
    return name, enc.framing_of(ctx.model_options(name) or ctx.model_options(None))


def _endpoint(ctx: base.RequestContext, name: str | None) -> str:
    """The model the path names; unknown: TransportInferenceAction's 404."""
    if not name or not ctx.model_options(name):
        # ModelNotFound stands for resource_not_found_exception (elastic_encode._ES_TYPES).
        raise errors.ModelNotFound(f"Inference endpoint not found [{name or ''}]")
    return name


def _message(m: wire.Message) -> canonical.Message:
    """One turn; content parts keep their `type` and `text` as given; no content is None (the
    worker decides whether the turn needs one)."""
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


# Request headers Elasticsearch copies onto every answer, errors included: the X-Opaque-Id its
# clients send (elasticsearch-py `opaque_id`) to find a request in their logs (server
# DefaultRestChannel.sendResponse). The gateway does so on every route below (registry.echoed).
ECHOED_HEADERS = ("x-opaque-id",)

# Elasticsearch's inference API (x-pack inference rest/Paths.java); `{id}` is a model name.
ROUTES = (
    base.InferenceRoute("/_inference/{id}", ElasticInferenceFrontend),
    base.InferenceRoute("/_inference/{id}/_unified", ElasticAnyTaskChatFrontend),
    base.InferenceRoute("/_inference/{id}/_stream", ElasticAnyTaskStreamFrontend),
    base.InferenceRoute("/_inference/chat_completion/{id}/_unified", ElasticChatFrontend),
    base.InferenceRoute("/_inference/chat_completion/{id}/_stream", ElasticChatFrontend),
    # Elasticsearch 9.6 (PR #158022): without `_stream`, a non-streaming chat completion.
    base.InferenceRoute("/_inference/chat_completion/{id}", ElasticChatWholeFrontend),
    base.InferenceRoute("/_inference/completion/{id}", ElasticCompletionFrontend),
    base.InferenceRoute("/_inference/completion/{id}/_stream", ElasticCompletionStreamFrontend),
    # Any other task type (or `completion` in another case): after the routes above.
    base.InferenceRoute("/_inference/{task_type}/{id}", ElasticTaskTypeFrontend),
)
# The get-endpoints API (RestGetInferenceModelAction), answered from the config; refusals in
# ES's generic error form.
STATUS_ROUTES = (
    base.StatusRouteSpec("/_inference", endpoints.all_endpoints, ElasticCompletionFrontend),
    base.StatusRouteSpec("/_inference/_all", endpoints.all_endpoints, ElasticCompletionFrontend),
    base.StatusRouteSpec("/_inference/{id}", endpoints.endpoint, ElasticCompletionFrontend),
    base.StatusRouteSpec("/_inference/{task_type}/{id}", endpoints.task_endpoint,
                         ElasticCompletionFrontend),
    # Elasticsearch's root (RestMainAction) for its clients' info and ping; TGI's GET / else.
    base.StatusRouteSpec("/", endpoints.main, ElasticCompletionFrontend,
                         claims=endpoints.from_client),
)
