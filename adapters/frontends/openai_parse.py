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
    f = raw.__dict__  # read as `_common` reads them
    req.messages = [_message(m) for m in f["messages"]]
    if f["max_completion_tokens"] is not None:
        req.sampling.max_tokens = f["max_completion_tokens"]
    req.logprobs = bool(f["logprobs"])
    req.top_logprobs = f["top_logprobs"] or 0
    if f["top_logprobs"] and not f["logprobs"]:
        raise errors.InvalidRequest(
            "`top_logprobs` requires `logprobs` to be true", field="top_logprobs"
        )
    if f["tools"]:
        req.tools = [_tool(t) for t in f["tools"]]
    req.tool_choice = _tool_choice(f["tool_choice"], f["tools"])
    req.parallel_tool_calls = f["parallel_tool_calls"]
    req.response_format = f["response_format"]
    req.reasoning_effort = f["reasoning_effort"]
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
    # The fields' values as pydantic keeps them, in the model's `__dict__`: read there, not
    # through BaseModel's `__getattr__` slot hook (two type lookups per read, some thirty reads)
    f = raw.__dict__
    stop, options = f["stop"], f["stream_options"]
    # positional, in the fields' order (a class called with keywords builds a dict and unpacks
    # it again; 22 of them were a whole answer's costliest call); vLLM's sampling extras under
    # the same names; a test sets each field alone and finds it in its place
    s = canonical.Sampling(
        f["max_tokens"], f["min_tokens"], f["temperature"], f["top_p"], f["top_k"], f["min_p"],
        f["typical_p"], f["repetition_penalty"], f["presence_penalty"], f["frequency_penalty"],
        f["length_penalty"], f["seed"], [stop] if isinstance(stop, str) else list(stop or []),
        list(f["stop_token_ids"] or []), f["ignore_eos"], None, f["n"] or 1, f["best_of"], None,
        f["logit_bias"], f["truncate_prompt_tokens"], None, f["skip_special_tokens"])
    if "" in s.stop:  # vLLM sampling_params.py _verify_args
        raise errors.InvalidRequest("`stop` cannot contain an empty string", field="stop")
    # vLLM protocol.py validate_stream_options: `if data.get("stream_options") and not
    # data.get("stream")`, so an empty object passes
    if options is not None and (options.model_fields_set or options.model_extra) \
            and not f["stream"]:
        raise errors.InvalidRequest(
            "`stream_options` is only allowed when `stream` is true", field="stream_options"
        )
    return canonical.InferenceRequest(
        model=f["model"],
        sampling=s,
        stream=bool(f["stream"]),
        include_usage=bool(f["stream"] and options and options.include_usage),
        continuous_usage=bool(f["stream"] and options and options.include_usage
                              and options.continuous_usage_stats),
        prompt_logprobs=f["prompt_logprobs"],
        token_ids=bool(f["return_token_ids"]),
        user=f["user"],
        extra=dict(raw.model_extra or {}),
    )


def _message(m: wire.ChatMessage) -> canonical.Message:
    f = m.__dict__  # read as `_common` reads them
    calls = None
    if f["tool_calls"] is not None:
        calls = [canonical.ToolCall(c.id, c.function.name, c.function.arguments)
                 for c in f["tool_calls"]]
    reasoning = f["reasoning_content"]
    # positional, in the field order (a call with keywords builds and unpacks a dict)
    return canonical.Message(f["role"], f["content"], f["name"], calls, f["tool_call_id"],
                             reasoning if reasoning is not None else f["reasoning"])


def _tool(t: wire.ToolSpec) -> canonical.ToolSpec:
    f = t.function
    return canonical.ToolSpec(f.name, f.description, f.parameters, f.strict)


def _tool_choice(choice: str | wire.NamedToolChoice | None,
                 listed: list[wire.ToolSpec] | None) -> str | None:
    """The tool choice, checked against the tools as vLLM's `check_tool_usage` does
    (protocol.py): any choice but "none" needs `tools`; "auto" or "required" with an empty
    list is no tool at all (vLLM: "required" is then "none", as OpenAI answers it); a named
    choice names one of them."""
    if choice is None or choice == "none":
        return choice
    if listed is not None and not listed and isinstance(choice, str):
        return None
    if listed is None:
        raise errors.InvalidRequest("When using `tool_choice`, `tools` must be set.",
                                    field="tool_choice")
    if isinstance(choice, str):
        return choice
    name = choice.function.name
    if not any(t.function.name == name for t in listed):
        raise errors.InvalidRequest(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            field="tool_choice")
    return name


def _prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise errors.InvalidRequest("`prompt` must not be empty", field="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return list(prompt)  # type: ignore[arg-type]
