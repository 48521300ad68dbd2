"""LMI `inputs` requests (seed 003) to canonical: every GenerationParameter, with LMI's defaults.

The mapping follows DJL's vLLM rolling-batch handler (`vllm_rolling_batch.py
translate_vllm_params`, v0.36.0): `max_new_tokens` -> max_tokens with a default of 30; greedy
(temperature 0) unless sampling is asked for; `stop_sequences` -> stop; `ignore_eos_token` ->
ignore_eos; `decoder_input_details` -> prompt_logprobs 1; `best_of` without `n` -> n = best_of;
`top_n_tokens` -> logprobs; `num_beams` -> beam search with that many sequences. Renames are the tables below; the worker's backend refuses, with a
4xx naming it, what its worker cannot do (typical_p, beams on TGI or Triton, token ids, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from adapters import validation
from schemas import canonical, errors
from schemas import lmi as wire

Schema = Literal["chat", "completion", "rolling", "dynamic"]

# Seed 003: "'max_new_tokens' : integer (default = 30)"; vllm_rolling_batch.py pops it with 30.
DEFAULT_MAX_NEW_TOKENS = 30

# GenerationParameters name -> canonical Sampling attribute (values copied as they are).
SAMPLING: dict[str, str] = {
    "repetition_penalty": "repetition_penalty",
    "top_k": "top_k",
    "top_p": "top_p",
    "typical_p": "typical_p",
    "truncate": "truncate",
    "ignore_eos_token": "ignore_eos",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "best_of": "best_of",
    "num_beams": "num_beams",
    "length_penalty": "length_penalty",
    "skip_special_tokens": "skip_special_tokens",
    "min_length": "min_tokens",  # TensorRT-LLM block
    "min_tokens": "min_tokens",  # vLLM's own name
    "logit_bias": "logit_bias",
}

# GenerationParameters with no canonical field -> the vLLM request field that carries them;
# they reach the worker through `extra` (vLLM takes them; trtllm-serve takes those it declares
# and its backend refuses the rest with a 4xx naming them).
EXTRA: dict[str, str] = {
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "early_stopping": "early_stopping",
    "bad_sequences": "bad_words",  # TensorRT-LLM block; vLLM SamplingParams.bad_words
    "bad_words": "bad_words",
    "allowed_token_ids": "allowed_token_ids",
}


# A worker's refusal names the canonical (or vLLM) field; the GenerationParameters a client
# may have set it with, first match wins, so that the 424 names what the client wrote.
CLIENT_NAMES: dict[str, tuple[str, ...]] = {
    "max_tokens": ("max_new_tokens",),
    "ignore_eos": ("ignore_eos_token",),
    "min_tokens": ("min_length", "min_tokens"),
    "stop": ("stop_sequences", "stop"),
    "keep_stop": ("include_stop_str_in_output",),
    "n": ("n", "best_of", "num_beams"),
    "prompt_logprobs": ("decoder_input_details", "prompt_logprobs"),
    "logprobs": ("top_n_tokens", "logprobs"),
    "top_logprobs": ("top_n_tokens", "logprobs"),
    "bad_words": ("bad_sequences", "bad_words"),
}


@dataclass(slots=True, frozen=True)
class LmiState:
    """Which LMI schema and framing a request uses; kept by its translator (lmi.LmiTranslator)."""

    schema: Schema
    stream: bool = False
    sse: bool = False  # streams framed `data: {...}\n\n` instead of JSON lines
    tgi_compat: bool = False  # list-wrapped body, `logprob` / `special` token keys
    details: bool = False
    prefill: bool = False  # details.prefill (decoder_input_details)
    top_n_tokens: int = 0  # details.top_tokens
    multi: bool = False  # n / best_of / num_beams > 1: DJL's best_of body
    full_text: bool = False  # return_full_text: the input is prepended to generated_text
    prompts: tuple[str, ...] = ()  # the inputs, for details.inputs and return_full_text
    n: int = 1  # choices per prompt
    params: frozenset[str] = frozenset()  # the GenerationParameters the client set

    def client_field(self, field: str) -> str | None:
        """`parameters.<name>` for a canonical field the client set under that name."""
        for name in CLIENT_NAMES.get(field, (field,)):
            if name in self.params:
                return f"parameters.{name}"
        return None

    def prefix(self, choice: int) -> str:
        """What goes before a choice's generated_text (output_formatter get_generated_text)."""
        return self.prompts[choice // self.n] if self.full_text else ""


def inputs_request(data: dict[str, Any], tgi_compat: bool,
                   sse: bool) -> tuple[canonical.InferenceRequest, LmiState]:
    """A seed-003 body in canonical form, and its schema and framing; `tgi_compat` / `sse` are
    the model's `lmi` options."""
    _known(data.get("parameters"))
    raw = validation.validate(wire.InputsRequest, data)
    p = raw.parameters or wire.GenerationParameters()
    stream = bool(raw.stream)
    dynamic = isinstance(raw.inputs, list)
    prompts = list(raw.inputs) if isinstance(raw.inputs, list) else [raw.inputs]
    _check(prompts, stream, p)
    sampling = _sampling(p)
    multi = sampling.n > 1 or (p.best_of or 1) > 1 or (p.num_beams or 1) > 1
    # get_details_dict: `parameters.get("details", tgi_compat)`; the best_of body always has
    # details; the dynamic-batch body never does ("details only available for rolling batch").
    details = not dynamic and (multi or (p.details if p.details is not None else tgi_compat))
    # Every streamed line carries the token's id and log_prob (seed 003 "Token"), as do details.
    per_token = not dynamic and (stream or details)
    top_n = p.top_n_tokens or 0
    req = canonical.InferenceRequest(
        prompts=list[str | list[int]](prompts), sampling=sampling, stream=stream,
        # The lines' ids and log_probs are `per_token` (the worker's, else the tokenizer's
        # ids and null, never refused); top tokens and `logprobs` are asked for by name.
        logprobs=bool(top_n) or p.logprobs is not None,
        top_logprobs=top_n or p.logprobs or 0,
        per_token=per_token,
        prompt_logprobs=_prompt_logprobs(p))
    st = LmiState(
        schema="dynamic" if dynamic else "rolling", stream=stream, sse=sse or tgi_compat,
        tgi_compat=tgi_compat, details=details,
        prefill=details and bool(p.decoder_input_details),
        top_n_tokens=top_n if details else 0, multi=multi,
        full_text=bool(p.return_full_text), prompts=tuple(prompts), n=sampling.n,
        params=frozenset(p.model_fields_set))
    for name, key in EXTRA.items():
        if (value := getattr(p, name)) is not None:
            req.extra[key] = value
    req.sampling.keep_stop = bool(p.include_stop_str_in_output)
    return req, st


def _known(params: Any) -> None:
    """An unknown parameter is a 424 naming it: no worker would take it (issue 4; DJL's vLLM
    handler drops it with a warning, which would answer something the client did not ask)."""
    if isinstance(params, dict):
        for key in params:
            if key not in wire.GenerationParameters.model_fields:
                raise errors.InvalidRequest(
                    f"`parameters.{key}` is not a generation parameter LMI knows (seed 003 "
                    "GenerationParameters or a vLLM sampling parameter)", field=f"parameters.{key}")


def _check(prompts: list[str], stream: bool, p: wire.GenerationParameters) -> None:
    """What LMI refuses before inference, each a 424 naming its field."""
    if not prompts or any(not s for s in prompts):
        # input_parser.py parse_lmi_default_request_rolling_batch: empty inputs are invalid.
        raise errors.InvalidRequest("`inputs` must not be empty", field="inputs")
    if not stream:
        return
    if p.decoder_input_details:
        # vLLM protocol.py: "`prompt_logprobs` are not available when `stream=True`".
        raise errors.InvalidRequest("`decoder_input_details` is not available when streaming",
                                    field="parameters.decoder_input_details")
    for name in ("n", "best_of", "num_beams"):
        if (getattr(p, name) or 1) > 1:
            # Seed 003: n and num_beams > 1 "only works with non-streaming case".
            raise errors.InvalidRequest(f"`{name}` greater than 1 only works without streaming",
                                        field=f"parameters.{name}")


def _sampling(p: wire.GenerationParameters) -> canonical.Sampling:
    s = canonical.Sampling(
        max_tokens=p.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
        temperature=0.0 if greedy(p) else p.temperature,
        seed=int(p.seed) if p.seed is not None else None,
        stop=_stop(p),
        stop_token_ids=list(p.stop_token_ids or []),
        # vllm_rolling_batch.py: "if n is not explicitly set when best_of is set, we return
        # `best_of` values sequences for tgi compatibility"; num_beams is best_of with beam
        # search there, so every beam comes back (seed 003 BestOfSequence: "also returned
        # when beam search is enabled with the option num_beams > 1").
        n=p.n if p.n is not None else (p.best_of or p.num_beams or 1),
    )
    for name, attr in SAMPLING.items():
        if (value := getattr(p, name)) is not None:
            setattr(s, attr, value)
    return s


def greedy(p: wire.GenerationParameters) -> bool:
    """Seed 003: greedy by default; `do_sample: false` forces it, and from LMI 0.32 sampling is
    "inferred from the other sampling parameters" (DJL's vLLM handler looks at `temperature`;
    top_p < 1, top_k > 0, min_p > 0 and typical_p < 1 ask for sampling as plainly)."""
    if p.do_sample is not None:
        return not p.do_sample
    asked = (p.temperature is not None or (p.top_p is not None and p.top_p < 1)
             or (p.top_k is not None and p.top_k > 0) or bool(p.min_p)
             or (p.typical_p is not None and p.typical_p < 1))
    return not asked


def _stop(p: wire.GenerationParameters) -> list[str]:
    out: list[str] = []
    for name, value in (("stop_sequences", p.stop_sequences), ("stop", p.stop)):
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            if "" in value:  # vLLM sampling_params.py _verify_args, where DJL sends them
                raise errors.InvalidRequest(f"`{name}` cannot contain an empty string",
                                            field=f"parameters.{name}")
            out.extend(value)
        elif value is True:
            raise errors.InvalidRequest(
                "`stop` must be a stop sequence or a list of them (DJL's TensorRT-LLM handler "
                "reads it as `stop_sequences`)", field="parameters.stop")
    return out


def _prompt_logprobs(p: wire.GenerationParameters) -> int | None:
    if p.prompt_logprobs is not None:
        return p.prompt_logprobs
    return 1 if p.decoder_input_details else None
