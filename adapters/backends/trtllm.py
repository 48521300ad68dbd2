"""trtllm-serve's OpenAI server: vLLM's sampling extras, but every unknown field is a 400.

Source: NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py (OpenAIBaseModel
`extra="forbid"`; ChatCompletionRequest / CompletionRequest fields; `model` required). It has
no `return_token_ids` and no `prompt_logprobs`, so those are refused before any I/O, as is an
extra the route's request class does not declare (chat and completions declare different ones;
`suffix` too: CompletionRequest.check_suffix) and a `reasoning_effort` outside its type. Its byte habits (a
space before a chunk's blank line, a dropped connection instead of an error event, a flat error
body) are handled by the shared SSE reader and decoder.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from adapters.backends import openai, params, vllm
from adapters.backends.params import Refuse, Send, Translate
from schemas import canonical

# trtllm-serve took its sampling extras from vLLM's protocol.py (its header says "Adapted
# from" it) and kept the names: the same table.
TRTLLM_SAMPLING: dict[str, params.Rule] = vllm.VLLM_SAMPLING

# openai_protocol.py ChatCompletionRequest `reasoning_effort: Optional[ReasoningEffort |
# Literal["low", "medium", "high", "max", "none"]]` (openai_harmony's ReasoningEffort: low,
# medium, high): OpenAI's `minimal` and `xhigh` have no equal there, and any other value is its
# 400, so they are ours, naming the field.
REASONING_EFFORTS = ("low", "medium", "high", "max", "none")


def _reasoning_effort(v: str) -> dict[str, Any]:
    if v not in REASONING_EFFORTS:
        raise params.refuse("reasoning_effort", f"{v!r} is not one of "
                            f"{', '.join(map(repr, REASONING_EFFORTS))}", "trtllm-serve")
    return {"reasoning_effort": v}


TRTLLM_OPTIONS: dict[str, params.Rule] = {
    **openai.OPENAI_OPTIONS, "reasoning_effort": Translate(_reasoning_effort)}

# Request fields trtllm-serve declares beyond those the canonical model carries: a client's
# extra field passes only if it is one of these (openai_protocol.py, both request classes).
def _structured_outputs(v: Any) -> dict[str, Any]:
    """vLLM's `structured_outputs` (TGI's front end sends a regex `grammar` so) as the
    `response_format` trtllm-serve takes for the same guide (openai_protocol.py ResponseFormat
    and `_response_format_to_guided_decoding_params`: regex, json with `schema`, json_object,
    ebnf)."""
    if isinstance(v, dict):
        if isinstance(v.get("regex"), str):
            return {"response_format": {"type": "regex", "regex": v["regex"]}}
        schema = v.get("json")
        if isinstance(schema, str):
            try:
                schema = orjson.loads(schema)
            except orjson.JSONDecodeError:
                raise params.invalid("structured_outputs", "`json` is not a JSON schema") \
                    from None
        if isinstance(schema, dict):
            return {"response_format": {"type": "json", "schema": schema}}
        if v.get("json_object") is True:
            return {"response_format": {"type": "json_object"}}
        if isinstance(v.get("grammar"), str):
            return {"response_format": {"type": "ebnf", "ebnf": v["grammar"]}}
    raise params.refuse("structured_outputs", "only `regex`, `json`, `json_object` and "
                        "`grammar` have a `response_format`", "trtllm-serve")


# openai_protocol.py: the extras both request classes declare, then each one's own. Each class
# forbids the other's (`extra="forbid"`), so each route has its own table: a chat-only field on
# /v1/completions (or the reverse) is our 400 naming it, not trtllm-serve's.
_BOTH: dict[str, params.Rule] = {
    "structured_outputs": Translate(_structured_outputs),
    **{name: Send() for name in (
        "use_beam_search", "top_p_min", "early_stopping", "include_stop_str_in_output",
        "spaces_between_special_tokens", "thinking_token_budget", "add_special_tokens",
        "lora_request", "priority", "prompt_ignore_length", "disaggregated_params",
        "conversation_params")},
}
# ChatCompletionRequest; `echo` there prepends the last message (as vLLM's chat `echo`).
TRTLLM_CHAT_EXTRAS: dict[str, params.Rule] = {
    **_BOTH,
    **{name: Send() for name in (
        "echo", "add_generation_prompt", "documents", "chat_template", "chat_template_kwargs",
        "cache_salt", "mm_processor_kwargs", "media_io_kwargs", "thinking", "agent_hierarchy")},
}
# CompletionRequest (`suffix` is declared but refused when set: check_suffix).
TRTLLM_COMPLETIONS_EXTRAS: dict[str, params.Rule] = {
    **_BOTH, **{name: Send() for name in ("return_context_logits", "detokenize")},
}
TRTLLM_EXTRA_FIELDS = frozenset(TRTLLM_CHAT_EXTRAS) | frozenset(TRTLLM_COMPLETIONS_EXTRAS)
# The extras a chat keeps when it is continued through CompletionRequest: those both classes
# declare with the same meaning. Not the chat's rendering inputs, its `add_special_tokens` (the
# continuation sets it), beam search or a disaggregated request's state.
TRTLLM_COMPLETION_EXTRAS = frozenset({
    "top_p_min", "include_stop_str_in_output", "spaces_between_special_tokens",
    "thinking_token_budget", "lora_request", "priority", "prompt_ignore_length",
    "conversation_params"})


class TrtllmBackend(openai.OpenAIBackend):
    """trtllm-serve: refuses what it would refuse, with our 400 naming the field. A chat cut
    mid-stream is continued (failover) through /v1/completions, the chat rendered with the
    model's `chat_template` plus the text so far (OpenAIBackend.continuation), never with a
    final assistant message: ChatCompletionRequest has `add_generation_prompt` but no
    `continue_final_message` (openai_protocol.py), so that message would be rendered as a
    closed turn. Without a `chat_template` a chat is not continued."""

    WORKER: ClassVar[str] = "trtllm-serve"
    SAMPLING: ClassVar[dict[str, params.Rule]] = TRTLLM_SAMPLING
    EXTRAS: ClassVar[dict[str, params.Rule]] = TRTLLM_CHAT_EXTRAS
    COMPLETIONS_EXTRAS: ClassVar[dict[str, params.Rule]] = TRTLLM_COMPLETIONS_EXTRAS
    UNKNOWN_EXTRA: ClassVar[params.Rule] = Refuse(
        "extra=\"forbid\"", message="`{name}` is not supported by this model's worker "
        "(trtllm-serve)")
    OPTIONS: ClassVar[dict[str, params.Rule]] = TRTLLM_OPTIONS
    TABLE: ClassVar[dict[str, params.Rule]] = {**SAMPLING, **OPTIONS}
    ACCEPTED_EXTRAS: ClassVar[frozenset[str]] = (
        params.accepted_extras(EXTRAS, apart=True)
        | params.accepted_extras(COMPLETIONS_EXTRAS, apart=True))
    PER_TOKEN_LOGPROBS: ClassVar[bool] = True  # CompletionRequest / ChatCompletionRequest `logprobs`
    # openai_protocol.py CompletionRequest `max_tokens: Optional[int] = None`: the engine's own
    # default, which may be the context's room, so no small bound is assumed.
    COMPLETIONS_MAX_TOKENS: ClassVar[int | None] = None
    COMPLETION_EXTRAS: ClassVar[frozenset[str]] = TRTLLM_COMPLETION_EXTRAS

    def extras(self, req: canonical.InferenceRequest) -> params.Table:
        """The route's own declared extras: ChatCompletionRequest's or CompletionRequest's."""
        return self.EXTRAS if req.messages is not None else self.COMPLETIONS_EXTRAS

    def stream_options(self, req: canonical.InferenceRequest) -> dict[str, Any]:
        """trtllm-serve's StreamOptions declares `continuous_usage_stats` (openai_protocol.py)
        and postprocess_handlers.py puts the worker's counts on every chunk with it, as vLLM."""
        if req.continuous_usage:
            return {"include_usage": True, "continuous_usage_stats": True}
        return {"include_usage": True}

    def health_path(self) -> str:
        return "/health"  # openai_server.py: 200, or 503 while the LLM is unavailable

    def limits(self, s: canonical.Sampling, body: dict[str, Any]) -> None:
        """`include_stop_str_in_output` is declared (openai_protocol.py); there is no way to
        ask for "as many tokens as fit", so `max_tokens` is left out and trtllm-serve's own
        default applies."""
        if s.keep_stop:
            body["include_stop_str_in_output"] = True

    def logprobs(self, req: canonical.InferenceRequest, body: dict[str, Any]) -> None:
        """A completions count of 0 asks trtllm-serve for nothing (openai_protocol.py
        CompletionRequest.to_sampling_params: logprobs only `if self.logprobs`), where vLLM
        gives the sampled token's: 1 gets the sampled token's log prob there too."""
        super().logprobs(req, body)
        if not req.is_chat and body.get("logprobs") == 0:
            body["logprobs"] = 1

    def opening(self, prompt: str, bos: bool) -> dict[str, object] | None:
        """CompletionRequest adds special tokens unless told not to (`add_special_tokens`
        default true), its chat route not (ChatCompletionRequest `add_special_tokens` default
        false: "the chat template takes care of adding the special tokens"; openai_protocol.py).
        The template's `bos_token` renders empty here, so the default adds the BOS where the
        template opened with it; any other opening (a BOS written out, ChatML) is sent as the
        chat route would encode it: `add_special_tokens: false`."""
        return {} if bos else {"add_special_tokens": False}

    def message(self, m: canonical.Message) -> dict[str, Any]:
        out = super().message(m)
        if m.reasoning is not None:  # ReasoningAssistantMessage.reasoning_content
            out["reasoning_content"] = m.reasoning
        return out
