"""Pydantic wire models of DJL Serving's LMI / SageMaker API: `/invocations`, `/predictions/{m}`.

A body with `inputs` is the rolling-batch schema (a string) or the dynamic-batch schema (a list)
of seed 003; `GenerationParameters` declares every parameter of seed 003's common, LMI-dist,
vLLM and TensorRT-LLM blocks, plus the vLLM SamplingParams names DJL's vLLM handler passes on
(`vllm_rolling_batch.py translate_vllm_params` keeps any VLLM_GENERATION_PARAMS name). Anything
else is refused with a 424 naming it. `messages` bodies are seed 000's chat schema and `prompt`
bodies seed 002's text completion; both are validated with the OpenAI models (schemas/openai.py),
whose fields they share. Response models below are what the encoders write; tests validate
against them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Int = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
PosInt = Annotated[int, Field(ge=1, le=2**63 - 1)]
NonNegInt = Annotated[int, Field(ge=0, le=2**63 - 1)]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GenerationParameters(_Closed):
    """Seed 003 "GenerationParameters"; None means the documented default."""

    # -- common to every rolling-batch backend
    do_sample: bool | None = None
    seed: Int | Annotated[str, Field(pattern=r"^-?[0-9]{1,19}$")] | None = None  # DJL: int(seed)
    temperature: float | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0)
    top_k: Int | None = None
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_new_tokens: PosInt | None = None
    details: bool | None = None
    return_full_text: bool | None = None
    stop_sequences: str | list[str] | None = None
    decoder_input_details: bool | None = None
    top_n_tokens: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None  # DJL -> vLLM logprobs
    # -- LMI-dist and vLLM blocks
    typical_p: float | None = Field(default=None, gt=0, le=1)
    truncate: PosInt | None = None
    ignore_eos_token: bool | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    n: int | None = Field(default=None, ge=1, le=128)
    best_of: int | None = Field(default=None, ge=1, le=128)
    num_beams: int | None = Field(default=None, ge=1, le=128)
    length_penalty: float | None = None
    early_stopping: bool | Literal["never"] | None = None
    stop_token_ids: list[Int] | None = None
    include_stop_str_in_output: bool | None = None
    logprobs: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    prompt_logprobs: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    # -- TensorRT-LLM block
    min_length: NonNegInt | None = None
    bad_sequences: list[str] | None = None
    # Seed 003 types `stop` as a boolean; DJL's TRT-LLM handler uses it as stop sequences
    # (trtllm_rolling_batch.py: `parameters["stop_sequences"] = stop`). Both are read.
    stop: bool | str | list[str] | None = None
    # -- vLLM SamplingParams names DJL's vLLM handler passes through as they are
    min_tokens: NonNegInt | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[Int] | None = None
    logit_bias: dict[str, float] | None = None
    # DJL overwrites this with the top-level `stream` (input_parser.py), so it is accepted and
    # has no effect.
    stream: bool | None = None


class InputsRequest(_Closed):
    """Seed 003 request: `inputs` a string (rolling batch) or a list of strings (dynamic batch).

    `model` is accepted and ignored: a SageMaker endpoint serves one model (front end docs)."""

    inputs: str | list[str]
    parameters: GenerationParameters | None = None
    stream: bool | None = False
    model: str | None = None


# ---- responses (what the encoders write; tests validate against these) ----


class Token(_Closed):
    """`request_io.Token.as_dict`: `special_token` only when true (the error token)."""

    id: int
    text: str
    log_prob: float | None
    special_token: bool | None = None


class TgiToken(_Closed):
    """`request_io.Token.as_tgi_dict` under `tgi_compat`."""

    id: int
    text: str
    logprob: float | None
    special: bool | None = None


FinishReason = Literal["length", "eos_token", "stop_sequence", "tool_calls", "abort",
                       "content_filter", "error"]


class BestOfSequence(_Closed):
    finish_reason: FinishReason | None
    generated_tokens: int
    tokens: list[Token] | list[TgiToken]
    prefill: list[Token] | list[TgiToken] | None = None
    top_tokens: list[list[Token]] | list[list[TgiToken]] | None = None
    generated_text: str


class Details(_Closed):
    """`output_formatter.get_details_dict` (and the best_of variant, `inputs` first)."""

    inputs: str | None = None
    finish_reason: FinishReason | None
    generated_tokens: int | None
    tokens: list[Token] | list[TgiToken] | None = None
    prefill: list[Token] | list[TgiToken] | None = None
    top_tokens: list[list[Token]] | list[list[TgiToken]] | None = None
    best_of_sequences: list[BestOfSequence] | None = None


class GeneratedText(_Closed):
    generated_text: str
    details: Details | None = None


class StreamLine(_Closed):
    """One JSON line of a rolling-batch stream; the last adds generated_text and details."""

    token: Token | TgiToken
    generated_text: str | None = None
    details: Details | None = None


class Error(_Closed):
    """The 424 body Java's `Request.addResponse` writes with Gson: `error` first."""

    error: str
    code: int


class DynamicBatchError(_Closed):
    """`Output.error` of the dynamic-batch handler."""

    code: int
    message: str
    error: str


class ChatLogprob(_Closed):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(ChatLogprob):
    top_logprobs: list[ChatLogprob]


class ChatLogprobs(_Closed):
    content: list[ChatTokenLogprob]


class ChatToolCall(_Closed):
    index: int | None = None
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str]


class ChatMessage(_Closed):
    role: Literal["assistant"] | None = None
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[ChatToolCall] | None = None


class ChatChoice(_Closed):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatUsage(_Closed):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(_Closed):
    """`_json_chat_output_formatter`: no `model` field."""

    id: str
    object: Literal["chat.completion"]
    created: int
    choices: list[ChatChoice]
    usage: ChatUsage


class ChatStreamChoice(_Closed):
    index: int
    delta: ChatMessage
    logprobs: list[ChatLogprobs] | None  # seed 000: a list (DJL's trailing-comma tuple)
    finish_reason: FinishReason | None


class ChatCompletionChunk(_Closed):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    choices: list[ChatStreamChoice]


class LmiOptions(BaseModel):
    """`models[].lmi`: how LMI-style answers of one model are framed (SPEC.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tgi_compat: bool = False
    output_formatter: Literal["jsonlines", "sse"] = "jsonlines"
