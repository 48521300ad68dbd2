"""vLLM's OpenAI server: the OpenAI API plus vLLM's sampling extras, token ids and prompt logprobs."""

from __future__ import annotations

from typing import Any, ClassVar

from adapters import base, continuation
from adapters.backends import openai, params
from adapters.backends.params import Send, Translate
from schemas import canonical

# vLLM v1 metrics (vllm/v1/metrics/loggers.py): the scheduler's waiting queue and the KV cache
# in use as a fraction (`gpu_cache_usage_perc` before v0.10).
LOAD = base.LoadGauges(queued=("vllm:num_requests_waiting",),
                       cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"))
# protocol.py ChatCompletionRequest: the last (assistant) message is continued, not closed.
CONTINUE_FLAGS: dict[str, object] = {"continue_final_message": True,
                                     "add_generation_prompt": False}

# vLLM protocol.py (ChatCompletionRequest / CompletionRequest sampling extras), after OpenAI's;
# what neither has stays refused.
VLLM_SAMPLING: dict[str, params.Rule] = {
    **{k: v for k, v in openai.OPENAI_SAMPLING.items() if isinstance(v, Send)},
    "min_tokens": Send("min_tokens"),
    "top_k": Send("top_k"),
    "min_p": Send("min_p"),
    "repetition_penalty": Send("repetition_penalty"),
    "length_penalty": Send("length_penalty"),
    "stop_token_ids": Send("stop_token_ids"),
    "ignore_eos": Send("ignore_eos"),
    "best_of": Send("best_of"),
    # protocol.py `use_beam_search`: the beam width is `n` (to_beam_search_params), which
    # the client protocol sets to the beam count (LMI: num_beams -> n, seed 003).
    "num_beams": Translate(lambda v: {"use_beam_search": True}, noop=1),
    "skip_special_tokens": Send("skip_special_tokens"),
    "truncate": Send("truncate_prompt_tokens"),
}
VLLM_SAMPLING.update({k: v for k, v in openai.OPENAI_SAMPLING.items() if k not in VLLM_SAMPLING})

VLLM_OPTIONS: dict[str, params.Rule] = {
    **openai.OPENAI_OPTIONS,
    "token_ids": Translate(lambda v: {"return_token_ids": True}),  # vLLM >= 0.10.2
    "per_token": Translate(lambda v: {"return_token_ids": True}),  # and its logprobs
    "prompt_logprobs": Send("prompt_logprobs"),
}

# Request fields vLLM's protocol.py declares (ChatCompletionRequest, CompletionRequest) that
# the canonical model does not carry: the client extras sent to vLLM (wire-formats.md 3.1: 0.11
# protocol.py, 0.33 chat_completion/ and completion/protocol.py). vLLM would accept any field
# (extra="allow"), but only declared ones go, so nothing else of a body reaches it.
VLLM_EXTRAS: dict[str, params.Rule] = {
    **openai.OPENAI_EXTRAS,
    **{name: Send() for name in (
        "echo", "use_beam_search", "include_stop_str_in_output", "spaces_between_special_tokens",
        "allowed_token_ids", "bad_words", "early_stopping", "include_reasoning",
        "add_generation_prompt", "continue_final_message", "add_special_tokens", "documents",
        "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "media_io_kwargs",
        "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
        "structural_tag", "guided_decoding_backend", "guided_whitespace_pattern", "priority",
        "request_id", "logits_processors", "return_tokens_as_token_ids", "cache_salt",
        "kv_transfer_params", "vllm_xargs", "prompt_embeds", "thinking_token_budget",
        "logprob_token_ids", "truncation_side", "session_id")},
}
VLLM_EXTRA_FIELDS = frozenset(VLLM_EXTRAS)


class VllmBackend(openai.OpenAIBackend):
    """vLLM's OpenAI server: its sampling extras, token ids and prompt logprobs."""

    WORKER: ClassVar[str] = "vllm"
    SAMPLING: ClassVar[dict[str, params.Rule]] = VLLM_SAMPLING
    OPTIONS: ClassVar[dict[str, params.Rule]] = VLLM_OPTIONS
    EXTRAS: ClassVar[dict[str, params.Rule]] = VLLM_EXTRAS
    TABLE: ClassVar[dict[str, params.Rule]] = {**SAMPLING, **OPTIONS}
    ACCEPTED_EXTRAS: ClassVar[frozenset[str]] = params.accepted_extras(EXTRAS, apart=True)
    PER_TOKEN_LOGPROBS: ClassVar[bool] = True

    def stream_options(self, req: canonical.InferenceRequest) -> dict[str, Any]:
        """With `continuous_usage_stats` the worker's own counts go on every chunk
        (serving_chat.py include_continuous_usage), its prompt count exact from the first."""
        if req.continuous_usage:
            return {"include_usage": True, "continuous_usage_stats": True}
        return {"include_usage": True}

    def limits(self, s: canonical.Sampling, body: dict[str, Any]) -> None:
        if s.max_tokens_fit and s.max_tokens is None:
            # protocol.py CompletionRequest: `max_tokens` null is max_model_len - prompt
            # length (the default is 16 on /v1/completions).
            body["max_tokens"] = None
        if s.keep_stop:
            body["include_stop_str_in_output"] = True

    def top_ids(self, body: dict[str, Any]) -> None:
        """vLLM's `return_tokens_as_token_ids`: every logprob token string is `token_id:N`
        (serving_engine.py _get_decoded_token), which the decoder reads as an id."""
        body["return_tokens_as_token_ids"] = True

    def message(self, m: canonical.Message) -> dict[str, Any]:
        out = super().message(m)
        if m.reasoning is not None:
            out["reasoning_content"] = m.reasoning
        return out

    def health_path(self) -> str:
        return "/health"  # 200, or 503 once the engine is dead (wire-formats.md 3.6)

    def load_gauges(self) -> base.LoadGauges | None:
        return LOAD

    def continuation(self, req: canonical.InferenceRequest, text_so_far: str,
                     tokens_so_far: int, options: base.Options = base.NO_OPTIONS
                     ) -> canonical.InferenceRequest | None:
        if req.messages is not None:
            return continuation.chat_prefix(req, text_so_far, tokens_so_far, CONTINUE_FLAGS)
        return continuation.completion(req, text_so_far, tokens_so_far)

    def continues(self, req: canonical.InferenceRequest,
                  options: base.Options = base.NO_OPTIONS) -> bool:
        return continuation.possible(req)
