"""OpenAI client protocol: /v1/chat/completions and /v1/completions, GET /v1/models[/{model}]."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from adapters import base, validation
from adapters.frontends import openai_encode as enc
from adapters.frontends import openai_parse, tgi_chat
from schemas import canonical, errors


@dataclass(slots=True)
class ChatTranslator:
    """One chat completion answered in OpenAI's shape."""

    request: canonical.InferenceRequest
    elasticsearch: bool = False  # from Elasticsearch's inference client (enc.from_elasticsearch)

    def encoder(self, meta: base.ResponseMeta) -> base.StreamEncoder:
        return enc.ChatStreamEncoder(self.request, meta, self.elasticsearch)

    def render(self, done: canonical.Completion, meta: base.ResponseMeta) -> base.Rendered:
        return base.Rendered(200, orjson.dumps(enc.chat_body(self.request, done, meta)))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        return enc.render_error(exc)


@dataclass(slots=True)
class CompletionTranslator:
    """One text completion answered in OpenAI's shape."""

    request: canonical.InferenceRequest

    def encoder(self, meta: base.ResponseMeta) -> base.StreamEncoder:
        return enc.CompletionStreamEncoder(self.request, meta)

    def render(self, done: canonical.Completion, meta: base.ResponseMeta) -> base.Rendered:
        return base.Rendered(200, orjson.dumps(enc.completion_body(self.request, done, meta)))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        return enc.render_error(exc)


class OpenAIChatFrontend:
    """POST /v1/chat/completions, for OpenAI and TGI clients alike: a request naming TGI's
    placeholder model (tgi_chat.placeholder) is read and answered as TGI's Messages API."""

    def parse(self, body: bytes, ctx: base.RequestContext) -> base.Translator:
        data = validation.load_object(body)
        model = data.get("model")
        # a placeholder stands for the default model only where no model has that name
        if tgi_chat.placeholder(model) and not (model and ctx.model_options(model)):
            return tgi_chat.ChatTranslator(tgi_chat.chat_request(data))
        return ChatTranslator(openai_parse.chat_request(data),
                              elasticsearch=enc.from_elasticsearch(ctx.headers))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        """TGI's error form for a request read as TGI's Messages API (tgi_chat.refusal)."""
        return tgi_chat.refusal(exc) or enc.render_error(exc)


class OpenAICompletionsFrontend:
    """POST /v1/completions, including list prompts and token-id prompts."""

    def parse(self, body: bytes, ctx: base.RequestContext) -> base.Translator:
        return CompletionTranslator(openai_parse.completion_request(validation.load_object(body)))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        return enc.render_error(exc)


def _model(name: str, view: base.GatewayView) -> dict[str, object]:
    return {"id": name, "object": "model", "created": view.started, "owned_by": "gateway"}


def models(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET /v1/models: every name and alias a client may send, in OpenAI's list shape."""
    data = [_model(name, view) for m in view.models for name in (m.name, *m.aliases)]
    return base.Rendered(200, orjson.dumps({"object": "list", "data": data}))


def model(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET /v1/models/{model} (openai-python `models.retrieve`, which percent-encodes a `/` in
    the name): one model object; an unknown name is OpenAI's 404 `model_not_found`."""
    name = ctx.path_params.get("model", "")
    if not any(name == n for m in view.models for n in (m.name, *m.aliases)):
        raise errors.ModelNotFound(f"The model `{name}` does not exist.", field="model")
    return base.Rendered(200, orjson.dumps(_model(name, view)))


def health(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET /health as vLLM answers it: 200 with an empty body, 503 when nothing can serve."""
    ok = view.default is not None and view.default.healthy
    return base.Rendered(200 if ok else 503, b"")


ROUTES = (
    # OpenAI's chat; TGI's placeholder model names are answered in TGI's Messages API shape.
    base.InferenceRoute("/v1/chat/completions", OpenAIChatFrontend),
    base.InferenceRoute("/v1/completions", OpenAICompletionsFrontend),
)
STATUS_ROUTES = (base.StatusRouteSpec("/v1/models", models, OpenAICompletionsFrontend),
                 base.StatusRouteSpec("/v1/models/{model:path}", model,
                                      OpenAICompletionsFrontend))
