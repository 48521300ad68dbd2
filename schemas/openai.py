"""Pydantic wire models of OpenAI's chat and completions APIs (requests, responses, chunks).

Requests are validated with these at the edge; responses and chunks are written by the encoders
with orjson and checked against these models in tests. Fields follow openai-python's types and
https://platform.openai.com/docs/api-reference/chat; vLLM's sampling extras are admitted because
vLLM clients send them (wire-formats.md section 3.1).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# JSON numbers beyond 64 bits cannot be sent on to any worker; refuse them at the edge.
Int = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class _Open(BaseModel):
    """Unknown fields are kept: vLLM clients send extras through `extra_body`."""

    model_config = ConfigDict(extra="allow")


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Open):
    name: str
    arguments: str = ""


class ToolCall(_Open):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    # Any role, as vLLM (CustomChatCompletionMessageParam), TGI (lib.rs `Message.role: String`)
    # and Elasticsearch take it: Llama 3.1's `ipython` tool results, say; the worker's chat
    # template decides what a role means.
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionSpec(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(_Open):
    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedToolChoiceFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"] = "function"
    function: NamedToolChoiceFunction


class StreamOptions(_Open):
    # True unless said: vLLM protocol.py and trtllm-serve openai_protocol.py StreamOptions, so
    # `stream_options: {}` is a usage chunk from either worker (OpenAI documents no default).
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = None


class SamplingExtras(_Open):
    """vLLM's sampling extras that the canonical model carries."""

    top_k: Int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    typical_p: float | None = None
    repetition_penalty: float | None = Field(default=None, gt=0)
    length_penalty: float | None = None
    min_tokens: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop_token_ids: list[Int] | None = None
    ignore_eos: bool | None = None
    best_of: int | None = Field(default=None, ge=1, le=2**63 - 1)
    skip_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=1, le=2**63 - 1)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=2**63 - 1)
    return_token_ids: bool | None = None


class CommonRequest(SamplingExtras):
    model: str | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=2**63 - 1)
    # null is 1, as vLLM's `n: Optional[int] = 1` and OpenAI's "integer or null"
    n: int | None = Field(default=1, ge=1, le=128)
    seed: Int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    user: str | None = None


class ChatCompletionRequest(CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=2**63 - 1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None


class CompletionRequest(CommonRequest):
    prompt: str | list[str] | list[Int] | list[list[Int]]
    # 0 with `echo`: the prompt alone, scored (vLLM completion/protocol.py
    # echo_without_generation); without `echo` it is refused in the translation.
    max_tokens: int | None = Field(default=None, ge=0, le=2**63 - 1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False
    suffix: str | None = None
    response_format: dict[str, Any] | None = None


# ---- responses and chunks (what the encoders write; tests validate against these) ----


class Usage(_Closed):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None
    completion_tokens_details: dict[str, int] | None = None


class TopLogprob(_Closed):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(_Closed):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(_Closed):
    content: list[TokenLogprob] | None = None


class ResponseMessage(_Closed):
    role: Literal["assistant"]
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Closed):
    index: int
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None


class ChatCompletion(_Closed):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None  # vLLM's, when asked


class ChunkToolCallFunction(_Closed):
    name: str | None = None
    arguments: str | None = None


class ChunkToolCall(_Closed):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChunkToolCallFunction | None = None


class Delta(_Closed):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChunkChoice(_Closed):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Closed):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(_Closed):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Closed):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None  # vLLM's, when asked
    prompt_token_ids: list[int] | None = None


class TextCompletion(_Closed):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ErrorObject(_Closed):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Closed):
    error: ErrorObject


class Model(_Closed):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(_Closed):
    object: Literal["list"] = "list"
    data: list[Model]


# Authorization header scheme of OpenAI's API keys (`Authorization: Bearer K`); TGI's and
# LMI's clients send the same.
AUTH_SCHEME = "bearer"
