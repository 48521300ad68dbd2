"""Pydantic wire models of Triton's generate extension in front of a TensorRT-LLM ensemble.

Request: `POST /v2/models/{model}/generate[_stream]` with `text_input` and the ensemble's other
inputs as top-level keys (triton-inference-server/server docs/protocol/extension_generate.md;
src/http_server.cc `ConvertGenerateRequest` maps a top-level key that names a model input to
that tensor, any other key to a request parameter). The inputs, their types and which are
required come from NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/ensemble/
config.pbtxt @ 2a9abd95. Response: one JSON object per model response (http_server.cc
`FinalizeResponse`: a std::map, so keys in byte order; one-element tensors written as scalars);
errors `{"error": "..."}`. The backend writes requests and reads responses with orjson; these
models are what the test worker validates against and what documents the format.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
UInt64 = Annotated[int, Field(ge=0, le=2**64 - 1)]


class GenerateRequest(BaseModel):
    """The ensemble's inputs (config.pbtxt `input`), as the gateway may send them.

    `extra="forbid"`: Triton would take an unknown key as a request parameter that the ensemble
    ignores, so a key the gateway sends by mistake would pass unnoticed; the test worker refuses it.
    """

    model_config = ConfigDict(extra="forbid")

    text_input: str
    max_tokens: Int32  # TYPE_INT32, the one required input besides text_input
    stream: bool | None = None
    exclude_input_in_output: bool | None = None
    return_num_input_tokens: bool | None = None
    return_num_output_tokens: bool | None = None
    return_log_probs: bool | None = None
    num_return_sequences: Int32 | None = None
    beam_width: Int32 | None = None
    bad_words: list[str] | None = None  # TYPE_STRING dims [-1]
    stop_words: list[str] | None = None  # TYPE_STRING dims [-1]
    end_id: Int32 | None = None
    pad_id: Int32 | None = None
    top_k: Int32 | None = None
    top_p: float | None = None  # TYPE_FP32
    temperature: float | None = None
    length_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: Int32 | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: UInt64 | None = None  # TYPE_UINT64
    embedding_bias_words: list[str] | None = None
    embedding_bias_weights: list[float] | None = None
    lora_task_id: UInt64 | None = None
    guided_decoding_guide_type: str | None = None  # json | json_schema | regex | ebnf_grammar
    guided_decoding_guide: str | None = None


# Inputs the gateway never takes from a client as is: it sets them itself (the first six) or
# they carry tensors no JSON client sends.
GATEWAY_INPUTS = frozenset({
    "text_input", "max_tokens", "stream", "exclude_input_in_output", "return_num_input_tokens",
    "return_num_output_tokens"})


class GenerateResponse(BaseModel):
    """One response (tensorrtllm_backend docs/llama.md and multimodal.md examples): the outputs
    the model produced plus `model_name`, `model_version`, `id` and the sequence parameters."""

    model_config = ConfigDict(extra="allow")

    model_name: str
    model_version: str
    text_output: str | list[str]
    cum_log_probs: float | list[float] | None = None
    output_log_probs: float | list[float] | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
    batch_index: int | None = None
    sequence_index: int | None = None
    sequence_start: bool | None = None
    sequence_end: bool | None = None
    sequence_id: int | None = None
    id: str | None = None


class ErrorResponse(BaseModel):
    """`$generate_error_response` (extension_generate.md; http_server.cc EVBufferAddErrorJson)."""

    model_config = ConfigDict(extra="forbid")

    error: str

