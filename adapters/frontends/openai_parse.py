"""OpenAI request bodies, already decoded, to canonical: chat completions and completions.

A decoded-object entry point, so that every front end that reads OpenAI's schema (the OpenAI
routes, TGI's Messages API reading, LMI's `messages` and `prompt` bodies) decodes a body once.
"""

from __future__ import annotations

from typing import Any

from adapters import validation
from schemas import canonical, errors
from schemas import openai as wire


def chat_request(data: dict[str, Any]) -> canonical.InferenceRequest:
    """A /v1/chat/completions body (a decoded JSON object) in canonical form."""
    raw = validation.validate(wire.ChatCompletionRequest, data)
    req = _common(raw)
    req.messages = [_message(m) for m in raw.messages]
    if raw.max_completion_tokens is not None:
        req.sampling.max_tokens = raw.max_completion_tokens
    req.logprobs = bool(raw.logprobs)
    req.top_logprobs = raw.top_logprobs or 0
    if raw.top_logprobs and not raw.logprobs:
        raise errors.InvalidRequest(
            "`top_logprobs` requires `logprobs` to be true", field="top_logprobs"
        )
    if raw.tools:
        req.tools = [_tool(t) for t in raw.tools]
    req.tool_choice = _tool_choice(raw.tool_choice)
    req.parallel_tool_calls = raw.parallel_tool_calls
    req.response_format = raw.response_format
    req.reasoning_effort = raw.reasoning_effort
    return req


def completion_request(data: dict[str, Any]) -> canonical.InferenceRequest:
    """A /v1/completions body (a decoded JSON object), list and token-id prompts included."""
    raw = validation.validate(wire.CompletionRequest, data)
    req = _common(raw)
    req.prompts = _prompts(raw.prompt)
    req.logprobs = raw.logprobs is not None
    req.top_logprobs = raw.logprobs or 0
    req.echo = bool(raw.echo)
    if raw.max_tokens == 0 and not req.echo:
        raise errors.InvalidRequest(
            "`max_tokens` must be at least 1 (0 only with `echo`)", field="max_tokens")
    req.response_format = raw.response_format
    if raw.suffix is not None:
        req.extra["suffix"] = raw.suffix
    return req


def _common(raw: wire.CommonRequest) -> canonical.InferenceRequest:
    """The fields chat and completions share."""
    s = canonical.Sampling(
        max_tokens=raw.max_tokens,
        temperature=raw.temperature,
        top_p=raw.top_p,
        presence_penalty=raw.presence_penalty,
        frequency_penalty=raw.frequency_penalty,
        seed=raw.seed,
        stop=[raw.stop] if isinstance(raw.stop, str) else list(raw.stop or []),
        stop_token_ids=list(raw.stop_token_ids or []),
        n=raw.n,
        logit_bias=raw.logit_bias,
        truncate=raw.truncate_prompt_tokens,
        # vLLM's sampling extras, under the same names (as arguments: a getattr and a setattr
        # per name were a twentieth of a whole answer's Python calls)
        top_k=raw.top_k,
        min_p=raw.min_p,
        typical_p=raw.typical_p,
        repetition_penalty=raw.repetition_penalty,
        length_penalty=raw.length_penalty,
        min_tokens=raw.min_tokens,
        ignore_eos=raw.ignore_eos,
        best_of=raw.best_of,
        skip_special_tokens=raw.skip_special_tokens,
    )
    if raw.stream_options is not None and not raw.stream:
        raise errors.InvalidRequest(
            "`stream_options` is only allowed when `stream` is true", field="stream_options"
        )
    return canonical.InferenceRequest(
        model=raw.model,
        sampling=s,
        stream=bool(raw.stream),
        include_usage=bool(raw.stream_options and raw.stream_options.include_usage),
        continuous_usage=bool(raw.stream_options and raw.stream_options.include_usage
                              and raw.stream_options.continuous_usage_stats),
        prompt_logprobs=raw.prompt_logprobs,
        token_ids=bool(raw.return_token_ids),
        user=raw.user,
        extra=dict(raw.model_extra or {}),
    )


def _message(m: wire.ChatMessage) -> canonical.Message:
    calls = None
    if m.tool_calls is not None:
        calls = [canonical.ToolCall(c.id, c.function.name, c.function.arguments)
                 for c in m.tool_calls]
    return canonical.Message(
        role=m.role,
        content=m.content,
        name=m.name,
        tool_calls=calls,
        tool_call_id=m.tool_call_id,
        reasoning=m.reasoning_content if m.reasoning_content is not None else m.reasoning,
    )


def _tool(t: wire.ToolSpec) -> canonical.ToolSpec:
    f = t.function
    return canonical.ToolSpec(f.name, f.description, f.parameters, f.strict)


def _tool_choice(choice: str | wire.NamedToolChoice | None) -> str | None:
    if choice is None or isinstance(choice, str):
        return choice
    return choice.function.name


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise errors.InvalidRequest("`prompt` must not be empty", field="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]
