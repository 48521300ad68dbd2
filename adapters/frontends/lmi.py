"""LMI / SageMaker client protocol: POST /invocations, POST /predictions/{model}, GET /ping.

SageMaker-style clients keep working when their endpoint URL points at the gateway. The body
decides the schema, as DJL's input parser does (`input_parser.py`: `messages` first): `messages`
is seed 000's chat completion, `prompt` seed 002's text completion (SageMaker vLLM), `inputs` a
string seed 003's rolling-batch schema and a list its dynamic-batch schema. The model's `lmi`
options pick the framing (`output_formatter`) and TGI compatibility (`tgi_compat`).

Which model: `/predictions/{model}` names it; `/invocations` always serves the default model and
ignores a body's `model` field, as LMI does (chat_properties.py excludes `model`; a SageMaker
endpoint serves one model), so clients that send any model name keep working. A LoRA adapter
(the body's `adapters` or SageMaker's adapter header) names the model that serves the request
instead (lmi_adapters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters import base, validation
from adapters.frontends import (
    lmi_adapters,
    lmi_encode,
    lmi_json,
    lmi_params,
    lmi_render,
    openai_parse,
)
from adapters.frontends.lmi_params import LmiState
from schemas import canonical, errors


@dataclass(slots=True)
class LmiTranslator:
    """One LMI request: the canonical request and the schema (and framing) it came in."""

    request: canonical.InferenceRequest
    state: LmiState

    def encoder(self, meta: base.ResponseMeta) -> base.StreamEncoder:
        if self.state.schema == "chat":
            return lmi_encode.ChatStreamEncoder(self.request, meta, self.state.sse)
        if self.state.schema == "completion":
            return lmi_encode.CompletionStreamEncoder(self.request, meta)
        if self.state.schema == "dynamic":
            return lmi_encode.DynamicStreamEncoder(self.state)
        return lmi_encode.RollingStreamEncoder(self.state)

    def render(self, done: canonical.Completion, meta: base.ResponseMeta) -> base.Rendered:
        st = self.state
        if st.schema == "chat":
            return base.Rendered(200, lmi_render.chat_body(self.request, done, meta))
        if st.schema == "completion":
            return base.Rendered(200, lmi_render.completion_body(self.request, done, meta))
        if st.schema == "dynamic":
            return base.Rendered(200, lmi_render.dynamic_body(st, done))
        return base.Rendered(200, lmi_render.rolling_body(st, done))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        """Seed 003 gives dynamic-batch requests and failed non-stream rolling-batch
        generations bodies of their own (lmi_render.render_error)."""
        return lmi_render.render_error(exc, self.state)


class LmiFrontend:
    """One frontend for both inference routes; the body picks the schema (`LmiState`)."""

    def parse(self, body: bytes, ctx: base.RequestContext) -> LmiTranslator:
        data = _load(body, ctx.headers.get("content-type"))
        name = ctx.path_params.get("model")  # /predictions/{model}; None: the default model
        want = lmi_adapters.requested(data, ctx.headers)
        # a LoRA's answers are framed by its own model entry's `lmi` options
        options = ctx.model_options(want.first or name)
        lmi: dict[str, Any] = dict(options.get("lmi") or {})
        sse = lmi.get("output_formatter") == "sse"
        if "messages" in data:
            # input_parser.py: chat requests get their own formatter (jsonlines_chat); tgi_compat
            # is read only by the rolling-batch formatters.
            req = openai_parse.chat_request(data)
            st = LmiState("chat", stream=req.stream, sse=sse)
        elif "prompt" in data:
            req = openai_parse.completion_request(data)
            st = LmiState("completion", stream=req.stream)
        elif "inputs" in data:
            req, st = _inputs_request(data, bool(lmi.get("tgi_compat")), sse)
        else:
            raise errors.InvalidRequest(
                "the request needs `inputs` (LMI schema), `messages` (chat completion) or "
                "`prompt` (text completion)", field="inputs")
        req.model = _served(want, name, st, ctx) if want.names else name
        return LmiTranslator(req, st)

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        """Errors before or while parsing: in the body of the schema the body was known to
        use, when it got that far (lmi_render.SchemaNote), else the 424 body."""
        note = base.note_of(exc, lmi_render.SchemaNote)
        return lmi_render.render_error(exc, note.state if note is not None else None)


# DJL encode_decode.py `decode`: a text body is the input itself, a list of one under
# text/plain (the dynamic-batch schema), the string under a form type (what curl -d sends).
_TEXT_BODIES = {"text/plain": True, "application/x-www-form-urlencoded": False}


def _load(body: bytes, ctype: str | None) -> dict[str, Any]:
    """The body as a JSON object; a text body that is not one, under a text type, as DJL
    reads it. (DJL reads JSON only under a JSON type; a JSON object here is JSON whatever its
    type, as a browser's fetch sends JSON text as text/plain.)"""
    try:
        return validation.load_object(body)
    except errors.InvalidRequest:
        listed = _TEXT_BODIES.get((ctype or "").split(";", 1)[0].strip().lower())
        if listed is None:
            raise
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise errors.InvalidRequest("Request body is not valid UTF-8 text") from None
        return {"inputs": [text] if listed else text}


def _served(want: lmi_adapters.Requested, name: str | None, st: LmiState,
            ctx: base.RequestContext) -> str | None:
    """The model an adapter request is served by, checked after its body as DJL does
    (format_input: parse_text_inputs_params, then parse_adapters); a refusal takes the body's
    schema. A model the path names must exist though a LoRA serves the request: DJL routes
    by it first (404)."""
    if name is not None and not ctx.model_options(name):
        raise errors.ModelNotFound(f"The model `{name}` does not exist.", field="model")
    inputs = len(st.prompts) if st.schema == "dynamic" else 1
    try:
        return lmi_adapters.served(want, inputs, lambda n: bool(ctx.model_options(n))) or name
    except errors.GatewayError as exc:
        raise exc from lmi_render.SchemaNote(st)


def _inputs_request(data: dict[str, Any], tgi_compat: bool,
                    sse: bool) -> tuple[canonical.InferenceRequest, LmiState]:
    """A seed-003 body; a list of `inputs` is the dynamic-batch schema, known before
    validation, so that its refusal takes that schema's error body."""
    try:
        return lmi_params.inputs_request(data, tgi_compat, sse)
    except errors.GatewayError as exc:
        if isinstance(data["inputs"], list):
            raise exc from lmi_render.SchemaNote(LmiState("dynamic"))
        raise


def ping(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET /ping as DJL answers it (InferenceRequestHandler, ModelManager.workerStatus): Gson's
    pretty map of model -> {"status": "Healthy" | "Unhealthy"} and a newline; 200 while the
    default model has a healthy upstream, 503 otherwise (SageMaker's contract: healthy = 200)."""
    statuses = [(m.name, "Healthy" if m.healthy else "Unhealthy") for m in view.models]
    ok = view.default is not None and view.default.healthy
    return base.Rendered(200 if ok else 503, lmi_json.gson_pretty_statuses(statuses))


# DJL Serving's InferenceRequestHandler; the body picks the schema.
ROUTES = (
    base.InferenceRoute("/invocations", LmiFrontend),
    base.InferenceRoute("/predictions/{model}", LmiFrontend),
    # DJL's InferenceRequestHandler: a fourth segment is the model's version; one is served
    base.InferenceRoute("/predictions/{model}/{version}", LmiFrontend),
)
# SageMaker's health check, open as its contract needs.
STATUS_ROUTES = (base.StatusRouteSpec("/ping", ping, LmiFrontend, open=True),)
