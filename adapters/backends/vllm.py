"""vLLM's OpenAI server: the OpenAI API plus vLLM's sampling extras, token ids and prompt logprobs."""

from __future__ import annotations

from typing import Any, ClassVar

from adapters.backends import openai
from schemas import canonical

# vLLM protocol.py (ChatCompletionRequest / CompletionRequest sampling extras).
VLLM_SAMPLING: dict[str, str] = {
    **openai.OPENAI_SAMPLING,
    "min_tokens": "min_tokens",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "length_penalty": "length_penalty",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "best_of": "best_of",
    "skip_special_tokens": "skip_special_tokens",
    "truncate": "truncate_prompt_tokens",
}


# Request fields vLLM's protocol.py declares (ChatCompletionRequest, CompletionRequest) that
# the canonical model does not carry: the client extras sent to vLLM. vLLM would accept any
# field (extra="allow"), but only declared ones go, so nothing else of a body reaches it.
VLLM_EXTRA_FIELDS = openai.OPENAI_EXTRA_FIELDS | frozenset({
    "use_beam_search", "include_stop_str_in_output", "spaces_between_special_tokens",
    "allowed_token_ids", "bad_words", "early_stopping", "include_reasoning",
    "add_generation_prompt", "continue_final_message", "add_special_tokens", "documents",
    "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "structured_outputs",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structural_tag",
    "guided_decoding_backend", "guided_whitespace_pattern", "priority", "request_id",
    "logits_processors", "return_tokens_as_token_ids", "cache_salt", "kv_transfer_params",
    "vllm_xargs", "prompt_embeds",
})


class VllmBackend(openai.OpenAIBackend):
    """vLLM's OpenAI server: its sampling extras, token ids and prompt logprobs."""

    SAMPLING: ClassVar[dict[str, str]] = VLLM_SAMPLING
    EXTRA_FIELDS: ClassVar[frozenset[str]] = VLLM_EXTRA_FIELDS
    TOKEN_IDS = True
    PROMPT_LOGPROBS = True
    PER_TOKEN_LOGPROBS = True

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

    def options(self, req: canonical.InferenceRequest, body: dict[str, Any]) -> None:
        super().options(req, body)
        if req.token_ids or req.per_token:
            body["return_token_ids"] = True  # vLLM >= 0.10.2
        if req.prompt_logprobs is not None:
            body["prompt_logprobs"] = req.prompt_logprobs

    def message(self, m: canonical.Message) -> dict[str, Any]:
        out = super().message(m)
        if m.reasoning is not None:
            out["reasoning_content"] = m.reasoning
        return out
