"""LMI / SageMaker client protocol: POST /invocations, POST /predictions/{model}, GET /ping.

SageMaker-style clients keep working when their endpoint URL points at the gateway. The body
decides the schema, as DJL's input parser does (`input_parser.py`: `messages` first): `messages`
is seed 000's chat completion, `prompt` seed 002's text completion (SageMaker vLLM), `inputs` a
string seed 003's rolling-batch schema and a list its dynamic-batch schema. The model's `lmi`
options pick the framing (`output_formatter`) and TGI compatibility (`tgi_compat`).

Which model: `/predictions/{model}` names it; `/invocations` always serves the default model and
ignores a body's `model` field, as LMI does (chat_properties.py excludes `model`; a SageMaker
endpoint serves one model), so clients that send any model name keep working.
"""

from __future__ import annotations

import contextvars
from typing import Any

from adapters import base, validation
from adapters.frontends import lmi_encode, lmi_json, lmi_params, lmi_render
from adapters.frontends import openai as openai_frontend
from adapters.frontends.lmi_params import LmiState
from schemas import canonical, errors

# The schema of the request being served in this task, for `render_error`, which sees only the
# exception: seed 003 gives dynamic-batch requests and failed non-stream rolling-batch
# generations bodies of their own. Set by `parse` in the request's task (the ASGI server runs
# each request in its own task, so each has its own value); reset first thing in `parse`.
_SCHEMA: contextvars.ContextVar[LmiState | None] = contextvars.ContextVar("lmi_schema",
                                                                         default=None)
_CHAT = openai_frontend.OpenAIChatFrontend()
_COMPLETIONS = openai_frontend.OpenAICompletionsFrontend()


class LmiFrontend:
    """One frontend for both inference routes; the body picks the schema (`LmiState`)."""

    def parse(self, body: bytes, ctx: base.RequestContext) -> canonical.InferenceRequest:
        _SCHEMA.set(None)
        data = validation.load_object(body)
        name = ctx.path_params.get("model")  # /predictions/{model}; None: the default model
        lmi: dict[str, Any] = dict(ctx.model_options(name).get("lmi") or {})
        sse = lmi.get("output_formatter") == "sse"
        if "messages" in data:
            # input_parser.py: chat requests get their own formatter (jsonlines_chat); tgi_compat
            # is read only by the rolling-batch formatters.
            req = _CHAT.parse(body, ctx)
            req.client_state = LmiState("chat", stream=req.stream, sse=sse)
        elif "prompt" in data:
            req = _COMPLETIONS.parse(body, ctx)
            req.client_state = LmiState("completion", stream=req.stream)
        elif "inputs" in data:
            if isinstance(data["inputs"], list):  # known before validation: its error body
                _SCHEMA.set(LmiState("dynamic"))
            req = lmi_params.inputs_request(data, bool(lmi.get("tgi_compat")), sse)
        else:
            raise errors.InvalidRequest(
                "the request needs `inputs` (LMI schema), `messages` (chat completion) or "
                "`prompt` (text completion)", field="inputs")
        req.model = name
        _SCHEMA.set(req.client_state)
        return req

    def encoder(self, req: canonical.InferenceRequest,
                meta: base.ResponseMeta) -> base.StreamEncoder:
        st: LmiState = req.client_state
        if st.schema == "chat":
            return lmi_encode.ChatStreamEncoder(req, meta)
        if st.schema == "completion":
            return lmi_encode.CompletionStreamEncoder(req, meta)
        return lmi_encode.RollingStreamEncoder(req)

    def render(self, req: canonical.InferenceRequest, done: canonical.Completion,
               meta: base.ResponseMeta) -> base.Rendered:
        st: LmiState = req.client_state
        if st.schema == "chat":
            return base.Rendered(200, lmi_render.chat_body(req, done, meta))
        if st.schema == "completion":
            return base.Rendered(200, lmi_render.completion_body(req, done, meta))
        if st.schema == "dynamic":
            return base.Rendered(200, lmi_render.dynamic_body(st, done))
        return base.Rendered(200, lmi_render.rolling_body(st, done))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        """Errors before the first byte, in the body of the request's schema (lmi_render)."""
        return lmi_render.render_error(exc, _SCHEMA.get())


def ping(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET /ping as DJL answers it (InferenceRequestHandler, ModelManager.workerStatus): Gson's
    pretty map of model -> {"status": "Healthy" | "Unhealthy"} and a newline; 200 while the
    default model has a healthy upstream, 503 otherwise (SageMaker's contract: healthy = 200)."""
    statuses = [(m.name, "Healthy" if m.healthy else "Unhealthy") for m in view.models]
    ok = view.default is not None and view.default.healthy
    return base.Rendered(200 if ok else 503, lmi_json.gson_pretty_statuses(statuses))
