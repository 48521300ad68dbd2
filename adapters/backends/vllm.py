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


class VllmBackend(openai.OpenAIBackend):
    """vLLM accepts unknown fields (extra="allow"), so client extras pass through as given."""

    SAMPLING: ClassVar[dict[str, str]] = VLLM_SAMPLING
    TOKEN_IDS = True
    PROMPT_LOGPROBS = True

    def options(self, req: canonical.InferenceRequest, body: dict[str, Any]) -> None:
        super().options(req, body)
        if req.token_ids:
            body["return_token_ids"] = True  # vLLM >= 0.10.2
        if req.prompt_logprobs is not None:
            body["prompt_logprobs"] = req.prompt_logprobs

    def message(self, m: canonical.Message) -> dict[str, Any]:
        out = super().message(m)
        if m.reasoning is not None:
            out["reasoning_content"] = m.reasoning
        return out
