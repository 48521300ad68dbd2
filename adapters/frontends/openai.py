"""OpenAI client protocol: /v1/chat/completions and /v1/completions requests to canonical."""

from __future__ import annotations

import orjson

from adapters import base, validation
from adapters.frontends import openai_encode as enc
from schemas import canonical, errors
from schemas import openai as wire

# vLLM sampling extras the canonical Sampling carries under the same name.
_SAMPLING_EXTRAS = (
    "top_k", "min_p", "typical_p", "repetition_penalty", "length_penalty", "min_tokens",
    "ignore_eos", "best_of", "skip_special_tokens",
)


class _OpenAIFrontend:
    """What chat and completions share: the error object."""

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        return render_error(exc)


class OpenAIChatFrontend(_OpenAIFrontend):
    """POST /v1/chat/completions."""

    def parse(self, body: bytes, ctx: base.RequestContext) -> canonical.InferenceRequest:
        raw = wire_request(wire.ChatCompletionRequest, body)
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
        if enc.from_elasticsearch(ctx.headers):
            req.client_state = enc.ELASTICSEARCH  # its chunks carry no `"usage": null`
        return req

    def encoder(
        self, req: canonical.InferenceRequest, meta: base.ResponseMeta
    ) -> base.StreamEncoder:
        return enc.ChatStreamEncoder(req, meta)

    def render(
        self, req: canonical.InferenceRequest, done: canonical.Completion, meta: base.ResponseMeta
    ) -> base.Rendered:
        return base.Rendered(200, orjson.dumps(enc.chat_body(req, done, meta)))


class OpenAICompletionsFrontend(_OpenAIFrontend):
    """POST /v1/completions, including list prompts and token-id prompts."""

    def parse(self, body: bytes, ctx: base.RequestContext) -> canonical.InferenceRequest:
        raw = wire_request(wire.CompletionRequest, body)
        req = _common(raw)
        req.prompts = _prompts(raw.prompt)
        req.logprobs = raw.logprobs is not None
        req.top_logprobs = raw.logprobs or 0
        req.echo = bool(raw.echo)
        req.response_format = raw.response_format
        if raw.suffix is not None:
            req.extra["suffix"] = raw.suffix
        return req

    def encoder(
        self, req: canonical.InferenceRequest, meta: base.ResponseMeta
    ) -> base.StreamEncoder:
        return enc.CompletionStreamEncoder(req, meta)

    def render(
        self, req: canonical.InferenceRequest, done: canonical.Completion, meta: base.ResponseMeta
    ) -> base.Rendered:
        return base.Rendered(200, orjson.dumps(enc.completion_body(req, done, meta)))


def wire_request(model: type[validation.M], body: bytes) -> validation.M:
    return validation.validate(model, validation.load_object(body))


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
    )
    for name in _SAMPLING_EXTRAS:
        setattr(s, name, getattr(raw, name))
    if raw.stream_options is not None and not raw.stream:
        raise errors.InvalidRequest(
            "`stream_options` is only allowed when `stream` is true", field="stream_options"
        )
    return canonical.InferenceRequest(
        model=raw.model,
        sampling=s,
        stream=bool(raw.stream),
        include_usage=bool(raw.stream_options and raw.stream_options.include_usage),
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


def render_error(exc: errors.GatewayError) -> base.Rendered:
    return enc.render_error(exc)


def models(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET /v1/models: every name and alias a client may send, in OpenAI's list shape."""
    data = [{"id": name, "object": "model", "created": view.started, "owned_by": "gateway"}
            for m in view.models for name in (m.name, *m.aliases)]
    return base.Rendered(200, orjson.dumps({"object": "list", "data": data}))


def health(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET /health as vLLM answers it: 200 with an empty body, 503 when nothing can serve."""
    ok = view.default is not None and view.default.healthy
    return base.Rendered(200 if ok else 503, b"")
