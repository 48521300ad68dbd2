"""trtllm-serve's OpenAI server: vLLM's sampling extras, but every unknown field is a 400.

Source: NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py (OpenAIBaseModel
`extra="forbid"`; ChatCompletionRequest / CompletionRequest fields; `model` required). It has
no `return_token_ids` and no `prompt_logprobs`, so those are refused before any I/O. Its
byte habits (a space before a chunk's blank line, a dropped connection instead of an error
event, a flat error body) are handled by the shared SSE reader and decoder.
"""

from __future__ import annotations

from typing import Any, ClassVar

from adapters.backends import openai, vllm
from schemas import canonical, errors

# trtllm-serve took its sampling extras from vLLM's protocol.py (its header says "Adapted
# from" it) and kept the names: the same table.
TRTLLM_SAMPLING: dict[str, str] = vllm.VLLM_SAMPLING

# Request fields trtllm-serve declares beyond those the canonical model carries: a client's
# extra field passes only if it is one of these (openai_protocol.py, both request classes).
TRTLLM_EXTRA_FIELDS = frozenset({
    "use_beam_search", "top_p_min", "early_stopping", "include_stop_str_in_output",
    "spaces_between_special_tokens", "return_context_logits", "detokenize",
    "thinking_token_budget", "add_special_tokens", "lora_request", "priority",
    "prompt_ignore_length", "disaggregated_params", "conversation_params",
    # chat only
    "add_generation_prompt", "documents", "chat_template", "chat_template_kwargs",
    "cache_salt", "mm_processor_kwargs", "media_io_kwargs", "thinking", "agent_hierarchy",
})


class TrtllmBackend(openai.OpenAIBackend):
    """trtllm-serve: refuses what it would refuse, with our 400 naming the field."""

    SAMPLING: ClassVar[dict[str, str]] = TRTLLM_SAMPLING
    EXTRA_FIELDS: ClassVar[frozenset[str]] = TRTLLM_EXTRA_FIELDS
    PER_TOKEN_LOGPROBS = True  # CompletionRequest / ChatCompletionRequest `logprobs`

    def limits(self, s: canonical.Sampling, body: dict[str, Any]) -> None:
        """`include_stop_str_in_output` is declared (openai_protocol.py); there is no way to
        ask for "as many tokens as fit", so `max_tokens` is left out and trtllm-serve's own
        default applies."""
        if s.keep_stop:
            body["include_stop_str_in_output"] = True

    def check(self, req: canonical.InferenceRequest) -> None:
        super().check(req)
        for key in req.extra:
            if key not in TRTLLM_EXTRA_FIELDS:
                raise errors.Unsupported(
                    f"`{key}` is not supported by this model's worker (trtllm-serve)", field=key)
        if "suffix" in req.extra:  # CompletionRequest.check_suffix
            raise errors.Unsupported("`suffix` is not supported by trtllm-serve", field="suffix")

    def message(self, m: canonical.Message) -> dict[str, Any]:
        out = super().message(m)
        if m.reasoning is not None:  # ReasoningAssistantMessage.reasoning_content
            out["reasoning_content"] = m.reasoning
        return out
