"""Pydantic wire models of Elasticsearch's inference API: the unified chat request, the legacy
completion request, and what the gateway answers (chunks, completion results, error bodies).

Requests are strict as Elasticsearch's parsers are (ConstructingObjectParser / ObjectParser
without ignoreUnknownFields: an unknown field is a 400). Sources: seed 004 (the chat completion
API), `server/.../inference/UnifiedCompletionRequest.java` (field names, the parser names used in
its messages), `x-pack/.../core/inference/action/InferenceAction.java` (the completion request),
`StreamingUnifiedChatCompletionResults.java` (the chunk), `UnifiedChatCompletionException.java`
(the unified error); wire-formats.md section 7.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# java.math.BigDecimal's number syntax (no blanks, no `_`, no NaN / Infinity).
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _java_long(value: Any) -> Any:
    """XContentParser.longValue() with its default coercion (declareLong): a fraction is cut
    toward zero, whether a JSON number (Jackson's getLongValue casts the double) or a string
    (AbstractXContentParser.toLong: BigDecimal.toBigInteger); the range is a long's."""
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise ValueError("not a number")
        return int(Decimal(value))
    if isinstance(value, float) and abs(value) < 2.0**63:
        return int(value)
    return value


# Elasticsearch reads max_completion_tokens as a Java long: any value, the worker decides.
Long = Annotated[int, BeforeValidator(_java_long), Field(ge=-(2**63), le=2**63 - 1)]


class _Strict(BaseModel):
    """Unknown fields are refused, as Elasticsearch's object parsers refuse them."""

    model_config = ConfigDict(extra="forbid")


# ---- the unified chat completion request (UnifiedCompletionRequest.PARSER) ----


class ContentObject(_Strict):
    text: str
    type: str


class ToolCallFunction(_Strict):  # parser "tool_call_function_field": both required
    arguments: str
    name: str


class ToolCall(_Strict):
    id: str
    function: ToolCallFunction
    type: Literal["function"]


class Message(_Strict):
    # Message.PARSER: `content` (string or array of objects) is an optionalConstructorArg, and
    # `role` any string (declareString): the provider decides what it takes.
    content: str | list[ContentObject] | None = None
    role: str
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None


class FunctionSpec(_Strict):  # parser "tool_function_field"
    description: str | None = None
    name: str
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    # Tool.PARSER takes any `type` string (so do ToolCall's and ToolChoiceObject's); canonical
    # tools have no type and every worker protocol is sent "function", so another type would
    # be silently turned into a function: refused here instead.
    type: Literal["function"]
    function: FunctionSpec


class ToolChoiceFunction(_Strict):  # parser "tool_choice_function_field"
    name: str


class ToolChoiceObject(_Strict):
    type: Literal["function"]
    function: ToolChoiceFunction


class UnifiedRequest(_Strict):
    """The body of POST _inference/{chat_completion/}{id}/_unified | _stream (seed 004)."""

    messages: list[Message]
    model: str | None = None
    max_completion_tokens: Long | None = None
    stop: list[str] | None = None  # declareStringArray (one string: a list of one)
    temperature: float | None = None  # declareFloat: no range, the worker decides
    # Seed 004: "One of `auto`, `none`, or `required`" or the object form. Elasticsearch takes
    # any string (ToolChoiceString) and passes it on; canonical `tool_choice` reads a string
    # other than these three as a function name, so others stay refused here.
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceObject | None = None
    tools: list[Tool] | None = None
    top_p: float | None = None  # declareFloat


# ---- the completion task request (InferenceAction.Request.PARSER) ----


class CompletionRequest(_Strict):
    """The body of POST _inference/completion/{id} and .../_stream."""

    input: list[str] | None = None  # declareStringArray (one string: a list of one)
    input_type: str | None = None
    task_settings: dict[str, Any] | None = None
    query: str | None = None
    return_documents: bool | None = None
    top_n: int | None = None
    timeout: str | None = None


# ---- what the gateway answers (written with orjson; tests validate against these) ----


class ChunkFunction(_Strict):
    arguments: str | None = None
    name: str | None = None


class ChunkToolCall(_Strict):
    index: int
    id: str | None = None
    function: ChunkFunction | None = None
    type: str | None = None  # written even when null (ToolCall.toXContentChunked)


class Delta(_Strict):
    content: str | None = None
    refusal: str | None = None
    role: str | None = None
    reasoning: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(_Strict):
    delta: Delta
    finish_reason: str | None = None
    index: int


class PromptTokensDetails(_Strict):
    cached_tokens: int


class CompletionTokensDetails(_Strict):
    reasoning_tokens: int


class Usage(_Strict):
    completion_tokens: int
    prompt_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class ChatCompletionChunk(_Strict):
    """StreamingUnifiedChatCompletionResults.ChatCompletionChunk: no `created`."""

    id: str
    choices: list[ChunkChoice]
    model: str
    object: Literal["chat.completion.chunk"]
    usage: Usage | None = None


class MessageChoice(_Strict):
    """A choice of the non-streaming answer: ChatCompletionChoiceResponse with `message`."""

    message: Delta
    finish_reason: str | None = None
    index: int


class ChatCompletion(_Strict):
    """POST _inference/chat_completion/{id} without `_stream` (Elasticsearch 9.6, PR
    #158022): ChatCompletionChunkResponse's non-streaming form; no `created`."""

    id: str
    choices: list[MessageChoice]
    model: str
    object: Literal["chat.completion"]
    usage: Usage | None = None


class ChunkEnvelope(_Strict):
    """Seed 004's documented event payload."""

    chat_completion: ChatCompletionChunk


class CompletionResult(_Strict):
    result: str


class CompletionResults(_Strict):
    """ChatCompletionResults: the completion task's whole answer."""

    completion: list[CompletionResult]


class CompletionDelta(_Strict):
    delta: str


class StreamingCompletionResults(_Strict):
    """StreamingChatCompletionResults.Results: one event of the completion task's stream."""

    completion: list[CompletionDelta]


class UnifiedErrorBody(_Strict):
    code: str | None = None
    message: str
    type: str


class UnifiedError(_Strict):
    """UnifiedChatCompletionException.toXContentChunked; no `param`: fromThrowable leaves it
    null, and a null param is not written."""

    error: UnifiedErrorBody


class RootCause(_Strict):
    type: str
    reason: str


class EsErrorBody(_Strict):
    root_cause: list[RootCause]
    type: str
    reason: str


class EsError(_Strict):
    """Elasticsearch's generic REST error (ElasticsearchException.generateFailureXContent)."""

    error: EsErrorBody
    status: int


class SimpleError(_Strict):
    """RestResponse.createSimpleErrorResponse (e.g. an unsupported Content-Type)."""

    error: str
    status: int


class ElasticOptions(BaseModel):
    """`elastic:` (gateway-wide): `documented` frames streams as seed 004 shows them,
    `server` as Elasticsearch itself writes them (SPEC.md, where the sources disagree)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    framing: Literal["documented", "server"] = "documented"


# Authorization header scheme of Elasticsearch's API keys (`Authorization: ApiKey K`).
AUTH_SCHEME = "apikey"
