"""Elastic client protocol, response side: SSE chunks, completion results and error bodies.

Two framings (SPEC.md, "Where the sources disagree"): `documented` is seed 004's
`event: message` + `data: {"chat_completion": {chunk}}`; `server` is what Elasticsearch writes
(ServerSentEventsRestActionListener): a UTF-8 BOM before every event and the bare chunk. The
chunk is the same in both: StreamingUnifiedChatCompletionResults.ChatCompletionChunk's field
order, `created` and `system_fingerprint` dropped, null delta fields and a null finish_reason
omitted. Each chunk is a pre-encoded head and tail around one orjson.dumps of its choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from types import MappingProxyType
from typing import Any, Final, Literal, assert_never

import orjson

from adapters import base, framing
from adapters.frontends import openai_encode
from schemas import canonical, errors
from schemas import events as ev

Framing = Literal["documented", "server"]

BOM: Final[bytes] = framing.BOM  # ServerSentEventsRestActionListener's, before every event
# RestController.ELASTIC_PRODUCT_HTTP_HEADER: elasticsearch-py refuses a 2xx without it
PRODUCT_HEADERS: Mapping[str, str] = MappingProxyType({"x-elastic-product": "Elasticsearch"})
SSE_MEDIA_TYPE = "text/event-stream"  # ServerSentEventSpec.MIME_TYPE
JSON_MEDIA_TYPE = "application/json"

# The provider's `finish_reason`, in OpenAI's names (wire-formats.md section 9)
FINISH = openai_encode.FINISH

# RestStatus names, which UnifiedChatCompletionException.fromThrowable lower-cases into `code`.
_STATUS_NAMES = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    406: "not_acceptable", 408: "request_timeout", 413: "request_entity_too_large",
    422: "unprocessable_entity", 424: "failed_dependency", 429: "too_many_requests",
    500: "internal_server_error", 501: "not_implemented", 502: "bad_gateway",
    503: "service_unavailable", 504: "gateway_timeout",
}

# The Elasticsearch exception of each gateway error (ElasticsearchException.getExceptionName)
_ES_TYPES: dict[type[errors.GatewayError], str] = {
    errors.InvalidRequest: "illegal_argument_exception",
    errors.Unauthorized: "security_exception",
    errors.ModelNotFound: "resource_not_found_exception",  # "Inference endpoint not found [x]"
    errors.Overloaded: "es_rejected_execution_exception",
    errors.RequestError: "status_exception",
    errors.UpstreamRejected: "status_exception",  # provider errors: ElasticsearchStatusException
    errors.UpstreamError: "status_exception",
    errors.GatewayError: "illegal_state_exception",
}


@dataclass(slots=True, frozen=True)
class ElasticState:
    """What parse noted about a completion request (kept by elastic.CompletionTranslator)."""

    framing: Framing = "documented"
    media_type: str = JSON_MEDIA_TYPE  # of a whole JSON answer (the compat type if asked)


def framing_of(options: Mapping[str, Any]) -> Framing:
    """The `elastic.framing` setting from a model's (or the gateway's) options."""
    elastic = options.get("elastic") or {}
    return "server" if elastic.get("framing") == "server" else "documented"


def event(name: bytes, data: bytes, framing: Framing) -> bytes:
    """One SSE event: `event: <name>`, `data: <data>`, a blank line; the BOM first on `server`."""
    return (BOM if framing == "server" else b"") + b"event: " + name + b"\ndata: " + data + b"\n\n"


def done(framing: Framing) -> bytes:
    """ServerSentEventDoneBodyPart: `event: message` + `data: [DONE]`."""
    return event(b"message", b"[DONE]", framing)


def usage_dict(u: ev.Usage) -> dict[str, Any]:
    """ChatCompletionChunk.Usage: completion, prompt, total; details only when known."""
    out: dict[str, Any] = {"completion_tokens": u.completion_tokens,
                           "prompt_tokens": u.prompt_tokens, "total_tokens": u.total_tokens}
    if u.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens}
    if u.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": u.reasoning_tokens}
    return out


def _call(e: ev.ToolCallDelta, call_id: str | None) -> dict[str, Any]:
    """Delta.ToolCall: index, id (when known), function {arguments, name}, then `type`, which
    ToolCall.toXContentChunked writes with `b.field` even when null (continuation fragments)."""
    fn: dict[str, Any] = {"arguments": e.arguments}
    if e.name is not None:
        fn["name"] = e.name
    out: dict[str, Any] = {"index": e.index}
    if call_id is not None:
        out["id"] = call_id
    out["function"] = fn
    out["type"] = "function" if call_id is not None else None
    return out


class ChatStreamEncoder:
    """Unified chat completion chunks, a usage chunk with empty choices, then [DONE]."""

    media_type = SSE_MEDIA_TYPE
    headers: Mapping[str, str] = PRODUCT_HEADERS
    holds_back = False  # `flush` is always b"" (base.StreamEncoder)

    def __init__(self, meta: base.ResponseMeta, framing: Framing):
        self._framing = framing
        head = b'{"id":' + orjson.dumps(openai_encode.CHAT_ID + meta.id) + b',"choices":['
        tail = b'],"model":' + orjson.dumps(meta.model) + b',"object":"chat.completion.chunk"'
        start = (BOM if framing == "server" else b"") + b"event: message\ndata: "
        # Seed 004 wraps each chunk in {"chat_completion": ...}; Elasticsearch's code does not.
        wrap = framing == "documented"
        self._prefix = start + (b'{"chat_completion":' if wrap else b"") + head
        self._tail = tail
        self._end = b"}}\n\n" if wrap else b"}\n\n"
        self._started: set[int] = set()
        self._usage: ev.Usage | None = None
        self._generated = 0
        self._meta = meta

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        return self._prefix + orjson.dumps(choice) + self._tail + self._end

    def _delta(self, choice: int, delta: dict[str, Any]) -> bytes:
        return self._role(choice) + self._chunk({"delta": delta, "index": choice})

    def _role(self, choice: int) -> bytes:
        """Seed 004's first chunk: `{"content":"","role":"assistant"}` (Delta field order)."""
        if choice in self._started:
            return b""
        self._started.add(choice)
        return self._chunk({"delta": {"content": "", "role": "assistant"}, "index": choice})

    def encode(self, e: ev.Event) -> bytes:
        if isinstance(e, ev.TextDelta):  # first: nearly every event is one
            self._generated += len(e.token_ids) if e.token_ids is not None else 1
            if type(e.choice) is not int:  # else one dumps of the text (`true` is no index 1)
                return self._delta(e.choice, {"content": e.text})
            return self._role(e.choice) + b'%s{"delta":{"content":%s},"index":%d}%s%s' % (
                self._prefix, orjson.dumps(e.text), e.choice, self._tail, self._end)
        if isinstance(e, ev.Role):
            return self._role(e.choice)
        if isinstance(e, ev.ReasoningDelta):
            return self._delta(e.choice, {"reasoning": e.text})  # Delta.reasoning
        if isinstance(e, ev.ToolCallDelta):
            return self._delta(e.choice,
                               {"tool_calls": [_call(e, self._meta.delta_call_id(e))]})
        if isinstance(e, ev.Finish):
            return self._role(e.choice) + self._chunk(
                {"delta": {}, "finish_reason": FINISH[e.reason], "index": e.choice})
        if isinstance(e, ev.Usage):
            self._usage = e
            return b""
        if isinstance(e, ev.PromptInfo):
            return b""
        assert_never(e)

    def flush(self) -> bytes:
        return b""  # nothing is held back

    def fail(self, exc: errors.GatewayError) -> bytes:
        """StreamingSubscriber.onError: one `event: error` and no [DONE]."""
        return event(b"error", orjson.dumps(unified_error(exc, mid_stream=True)), self._framing)

    def finish(self) -> bytes:
        """Seed 004: "The last object message of the stream contains the token usage"."""
        usage = self._usage or ev.Usage(0, self._generated)
        last = (self._prefix + self._tail + b',"usage":' + orjson.dumps(usage_dict(usage))
                + self._end)
        return last + done(self._framing)


class CompletionStreamEncoder:
    """The completion task's stream: `{"completion":[{"delta": text}]}` per event, then
    [DONE] (StreamingChatCompletionResults.Results); reasoning, finish and usage have no place."""

    media_type = SSE_MEDIA_TYPE
    headers: Mapping[str, str] = PRODUCT_HEADERS
    holds_back = False  # `flush` is always b"" (base.StreamEncoder)

    def __init__(self, framing: Framing):
        self._framing = framing
        self._prefix = ((BOM if framing == "server" else b"") + b"event: message\ndata: "
                        + b'{"completion":[{"delta":')

    def encode(self, e: ev.Event) -> bytes:
        if isinstance(e, ev.TextDelta):
            if not e.text:  # OpenAiStreamingProcessor drops empty content
                return b""
            return self._prefix + orjson.dumps(e.text) + b"}]}\n\n"
        if isinstance(e, ev.Role | ev.ReasoningDelta | ev.ToolCallDelta | ev.Finish | ev.Usage
                      | ev.PromptInfo):
            return b""
        assert_never(e)

    def flush(self) -> bytes:
        return b""

    def fail(self, exc: errors.GatewayError) -> bytes:
        """errorChunk: an exception the inference layer did not format is ES's generic error."""
        return event(b"error", orjson.dumps(es_error(exc)), self._framing)

    def finish(self) -> bytes:
        return done(self._framing)


def chat_body(done_: canonical.Completion, meta: base.ResponseMeta) -> dict[str, Any]:
    """A whole chat completion as Elasticsearch answers POST _inference/chat_completion/{id}
    (PR #158022): ChatCompletionChunkResponse's non-streaming form, the stream chunk's shape
    with `message` for `delta` — id, choices (message, finish_reason, index), model, object
    `chat.completion`, usage; no `created`; null fields left out (ChatCompletionMessageResponse
    content, refusal, role, reasoning, tool_calls; ChatCompletionToolCall index, id,
    function {arguments, name}, type)."""
    choices = []
    for c in done_.choices:
        msg: dict[str, Any] = {}
        if c.text or not c.tool_calls:
            msg["content"] = c.text
        msg["role"] = "assistant"
        if c.reasoning:
            msg["reasoning"] = c.reasoning
        if c.tool_calls:
            msg["tool_calls"] = [
                {"index": i, "id": meta.call_id(c.index, i, t.id, t.name),
                 "function": {"arguments": t.arguments, "name": t.name},
                 "type": "function"} for i, t in enumerate(c.tool_calls)]
        choice: dict[str, Any] = {"message": msg}
        if c.finish is not None:
            choice["finish_reason"] = FINISH[c.finish.reason]
        choice["index"] = c.index
        choices.append(choice)
    generated = sum(len(c.token_ids or ()) for c in done_.choices)
    return {"id": openai_encode.CHAT_ID + meta.id, "choices": choices, "model": meta.model,
            "object": "chat.completion",
            "usage": usage_dict(done_.usage or ev.Usage(0, generated))}


def completion_body(done_: canonical.Completion) -> dict[str, Any]:
    """ChatCompletionResults: `{"completion": [{"result": text}]}`, one result per choice."""
    return {"completion": [{"result": c.text} for c in done_.choices]}


# ---- errors ----


class EsNote(base.Note):
    """A refusal's Elasticsearch side, chained as its cause (`raise exc from EsNote(...)`):
    the exception Elasticsearch raises there (`es_type`, None: the error class's own), whether
    it raises it in its REST layer (before the SSE listener exists: a JSON body, never SSE),
    whether it reaches the listener outside the chat routes' unified-error wrapper (`generic`:
    ES's generic error form on every route), and the framing of the route's gateway, noted by
    parse for render_error."""

    def __init__(self, es_type: str | None = None, rest: bool = False,
                 framing: Framing | None = None, generic: bool = False):
        super().__init__(es_type)
        self.es_type = es_type
        self.rest = rest
        self.framing: Framing | None = framing
        self.generic = generic

    def framed(self, framing: Framing, generic: bool = False) -> EsNote:
        return EsNote(self.es_type, self.rest, framing, self.generic or generic)


def framed(exc: errors.GatewayError, framing: Framing, generic: bool = False) -> EsNote:
    """The note of an error raised while parsing, with the request's framing added (and
    `generic` where the whole route answers in ES's generic form)."""
    return (base.note_of(exc, EsNote) or EsNote()).framed(framing, generic)


def refusal_framing(exc: errors.GatewayError, default: Framing) -> Framing:
    """The framing parse noted on a refusal; `default` for errors before parse."""
    note = base.note_of(exc, EsNote)
    return note.framing if note is not None and note.framing is not None else default


def es_type(exc: errors.GatewayError) -> str:
    note = base.note_of(exc, EsNote)
    if note is not None and note.es_type is not None:
        return note.es_type
    return next(_ES_TYPES[c] for c in type(exc).__mro__ if c in _ES_TYPES)


def rest_layer(exc: errors.GatewayError) -> bool:
    """Errors Elasticsearch answers before its SSE listener exists: security (401), request
    size (413) and read time (408), thread-pool rejection (429), a bad Content-Type (406), an
    empty body, or no handler for the path or method; RestController writes them as JSON
    (wire-formats.md 7.4)."""
    note = base.note_of(exc, EsNote)
    if note is not None and note.rest:
        return True
    return isinstance(exc, errors.Unauthorized | errors.PayloadTooLarge | errors.Overloaded
                      | errors.NoRoute) or exc.status == 408


def generic(exc: errors.GatewayError) -> bool:
    """Whether Elasticsearch answers the error in its generic form on a chat route too."""
    note = base.note_of(exc, EsNote)
    return note is not None and note.generic


def es_status(exc: errors.GatewayError) -> int:
    """A worker that did not answer in time is Elasticsearch's inference timeout: 408 "Request
    timed out after [..]" (x-pack inference RequestTask), which elastic-transport does not
    retry; a 504 it sends again up to three times, each a generation on the worker."""
    return 408 if isinstance(exc, errors.UpstreamTimeout) else exc.status


def status_name(status: int) -> str:
    if status in _STATUS_NAMES:
        return _STATUS_NAMES[status]
    try:
        return HTTPStatus(status).name.lower()
    except ValueError:
        return "internal_server_error"


def unified_error(exc: errors.GatewayError, mid_stream: bool = False) -> dict[str, Any]:
    """UnifiedChatCompletionException: code, message, type. `code` is the lower-cased status
    name and `param` null, so toXContentChunked leaves it out (fromThrowable); a failure after
    the stream began is `stream_error`, as the OpenAI service's mid-stream errors are
    (buildMidStreamError)."""
    code = "stream_error" if mid_stream else status_name(es_status(exc))
    return {"error": {"code": code, "message": exc.message, "type": es_type(exc)}}


def es_error(exc: errors.GatewayError) -> dict[str, Any]:
    """ElasticsearchException.generateFailureXContent with detailed errors on: root_cause, type,
    reason, then the HTTP status (ServerSentEventsRestActionListenerTests shows the bytes)."""
    cause = {"type": es_type(exc), "reason": exc.message}
    return {"error": {"root_cause": [cause], **cause}, "status": es_status(exc)}


def _headers(exc: errors.GatewayError) -> dict[str, str]:
    return {**PRODUCT_HEADERS, **base.retry_headers(exc)}  # elastic-transport retries 429


def render_json_error(exc: errors.GatewayError) -> base.Rendered:
    """A whole JSON error: the simple form for a refused Content-Type
    (RestResponse.createSimpleErrorResponse), RestController's own words for a path or method
    no handler takes, ES's generic error otherwise."""
    if isinstance(exc, errors.NoRoute) and exc.method:
        return _no_handler(exc)
    if exc.status == 406:
        body = orjson.dumps({"error": exc.message, "status": exc.status})
    else:
        body = orjson.dumps(es_error(exc))
    return base.Rendered(es_status(exc), body, JSON_MEDIA_TYPE, _headers(exc))


def _no_handler(exc: errors.NoRoute) -> base.Rendered:
    """RestController: a method the path's handler does not take is a 405 in the simple form
    (handleUnsupportedHttpMethod, `allowed: [...]` as a Java set prints); a path no handler
    takes is a 400 with a bare `error` string (handleBadRequest)."""
    if isinstance(exc, errors.MethodNotAllowed):
        allowed = ", ".join(m.strip() for m in exc.allowed.split(",") if m.strip())
        body = {"error": f"Incorrect HTTP method for uri [{exc.uri}] and method [{exc.method}]"
                         + (f", allowed: [{allowed}]" if allowed else ""), "status": 405}
        return base.Rendered(405, orjson.dumps(body), JSON_MEDIA_TYPE, _headers(exc))
    body = {"error": f"no handler found for uri [{exc.uri}] and method [{exc.method}]"}
    return base.Rendered(400, orjson.dumps(body), JSON_MEDIA_TYPE, _headers(exc))


def render_unified_json_error(exc: errors.GatewayError) -> base.Rendered:
    """An error of the non-streaming chat route: the unified error object
    (UnifiedChatCompletionException) as a JSON body with the error's status; errors of the
    REST layer and those outside the unified wrapper keep ES's generic JSON form."""
    if rest_layer(exc) or generic(exc):
        return render_json_error(exc)
    return base.Rendered(es_status(exc), orjson.dumps(unified_error(exc)), JSON_MEDIA_TYPE,
                         _headers(exc))


def render_stream_error(exc: errors.GatewayError, framing: Framing,
                        unified: bool) -> base.Rendered:
    """An error of a streaming route: ServerSentEventsRestActionListener.onFailure sends it as
    `event: error` with the error's own HTTP status; errors of the REST layer are JSON. On a
    chat route (`unified`) an error outside the unified wrapper is ES's generic error."""
    if rest_layer(exc):
        return render_json_error(exc)
    payload = unified_error(exc) if unified and not generic(exc) else es_error(exc)
    return base.Rendered(es_status(exc), event(b"error", orjson.dumps(payload), framing),
                         SSE_MEDIA_TYPE, _headers(exc))
