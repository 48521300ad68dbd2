"""Pydantic wire models of Hugging Face TGI's own API: /generate, /generate_stream, POST /, /info.

Fields and their order follow TGI's router (`router/src/lib.rs` @ db931fcf, v3.3.7): requests
are validated with these at the edge (TGI's range checks, with its messages, live in the
frontend); responses are written by the encoders with orjson and checked against these models in
tests. Unknown request fields are ignored, as serde does for TGI (no `deny_unknown_fields`).
TGI rejects `null` for its `bool` and `Vec` fields; we read `null` as the default instead.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

U32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
U64 = Annotated[int, Field(ge=0, le=2**64 - 1)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Grammar(_Open):
    """`GrammarType` (lib.rs): `#[serde(tag = "type", content = "value")]`; `json_object` is an
    alias of `json`."""

    type: Literal["json", "json_object", "regex", "json_schema"]
    value: Any = None


class GenerateParameters(_Open):
    """`GenerateParameters` (lib.rs); TGI's range checks are in the frontend (validation.rs)."""

    best_of: U32 | None = None
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool | None = None
    max_new_tokens: U32 | None = None
    return_full_text: bool | None = None
    stop: list[str] | None = None
    truncate: U32 | None = None
    watermark: bool | None = None
    details: bool | None = None
    decoder_input_details: bool | None = None
    seed: U64 | None = None
    top_n_tokens: U32 | None = None
    grammar: Grammar | None = None
    adapter_id: str | None = None


class GenerateRequest(_Open):
    """POST /generate and /generate_stream; an absent `parameters` is `default_parameters()`."""

    inputs: str
    parameters: GenerateParameters | None = None


class CompatGenerateRequest(GenerateRequest):
    """POST /: the same body plus `stream`, which picks generate or generate_stream."""

    stream: bool | None = False


# ---- responses (what the encoders write; tests validate against these) ----

FinishReason = Literal["length", "eos_token", "stop_sequence"]


class Token(_Closed):
    id: int
    text: str
    logprob: float | None  # f32; NaN is written as null by serde_json
    special: bool


class PrefillToken(_Closed):
    id: int
    text: str
    logprob: float | None  # the first prompt token has none (null)


class BestOfSequence(_Closed):
    generated_text: str
    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None
    prefill: list[PrefillToken]
    tokens: list[Token]
    top_tokens: list[list[Token]] | None = None  # skip_serializing_if = "Vec::is_empty"


class Details(_Closed):
    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None
    prefill: list[PrefillToken]
    tokens: list[Token]
    best_of_sequences: list[BestOfSequence] | None = None  # skip_serializing_if is_none
    top_tokens: list[list[Token]] | None = None  # skip_serializing_if = "Vec::is_empty"


class GenerateResponse(_Closed):
    generated_text: str
    details: Details | None = None  # skip_serializing_if is_none


class StreamDetails(_Closed):
    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None
    input_length: int


class StreamResponse(_Closed):
    index: int
    token: Token
    top_tokens: list[Token] | None = None  # skip_serializing_if = "Vec::is_empty"
    generated_text: str | None
    details: StreamDetails | None


class ErrorResponse(_Closed):
    error: str
    error_type: str


class Info(_Closed):
    """`Info` (lib.rs), in its field order."""

    model_id: str
    model_sha: str | None
    model_pipeline_tag: str | None
    max_concurrent_requests: int
    max_best_of: int
    max_stop_sequences: int
    max_input_tokens: int
    max_total_tokens: int
    validation_workers: int
    max_client_batch_size: int
    router: str
    version: str
    sha: str | None
    docker_label: str | None
