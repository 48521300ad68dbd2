"""Any OpenAI-compatible worker: canonical requests to /v1/chat/completions and /v1/completions.

The parameter mapping is data: `SAMPLING` maps canonical Sampling fields to this worker's
names. A canonical field that is set but has no entry is refused with a 4xx naming it, so a
client never gets a silently different answer. Subclasses (vLLM, trtllm-serve) extend the tables.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson
import structlog

from adapters import base
from adapters.backends import openai_decode
from schemas import canonical, errors

# canonical Sampling attribute -> OpenAI request field (openai api-reference, chat/create).
OPENAI_SAMPLING: dict[str, str] = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "stop": "stop",
    "n": "n",
    "logit_bias": "logit_bias",
}

# Request fields of OpenAI's API that the canonical model does not carry: the client extras an
# OpenAI-compatible worker declares (openai api-reference, chat/create and completions/create).
# Any other extra is dropped with a log line, never sent: a body's `api_key`, `api_base`,
# `base_url`, `extra_headers` or `upstream_model` must not reach a worker (issue 12).
OPENAI_EXTRA_FIELDS = frozenset({
    "max_tokens", "suffix", "store", "metadata", "service_tier", "modalities", "prediction",
    "audio", "web_search_options", "verbosity", "prompt_cache_key", "safety_identifier",
})

_log: Any = structlog.get_logger("gateway")

# Canonical fields whose unset value is not None.
_UNSET: dict[str, Any] = {"stop": [], "stop_token_ids": [], "n": 1,
                          "max_tokens_fit": False, "keep_stop": False}
# Sampling fields each worker says in its own terms (`limits`), not by a rename.
_OWN_SAMPLING = frozenset({"max_tokens_fit", "keep_stop"})


class OpenAIBackend:
    """Speaks the OpenAI API as any compatible server does."""

    SAMPLING: ClassVar[dict[str, str]] = OPENAI_SAMPLING
    EXTRA_FIELDS: ClassVar[frozenset[str]] = OPENAI_EXTRA_FIELDS  # client extras it declares
    CHAT_PATH = "/v1/chat/completions"
    COMPLETIONS_PATH = "/v1/completions"
    # What the worker can return besides text, decided before any I/O.
    TOKEN_IDS = False
    PROMPT_LOGPROBS = False
    # Ask for logprobs when a client's format carries one per token (`per_token`) although
    # it did not ask: only where the worker surely takes the field.
    PER_TOKEN_LOGPROBS = False

    def check(self, req: canonical.InferenceRequest) -> None:
        for name in canonical.Sampling.__slots__:
            value = getattr(req.sampling, name)
            if name not in self.SAMPLING and name not in _OWN_SAMPLING \
                    and value != _UNSET.get(name):
                raise errors.Unsupported(
                    f"`{name}` is not supported by this model's worker", field=name)
        if req.token_ids and not self.TOKEN_IDS:
            raise errors.Unsupported("token ids are not available from this model's worker",
                                     field="token_ids")
        if req.prompt_logprobs is not None and not self.PROMPT_LOGPROBS:
            raise errors.Unsupported("`prompt_logprobs` is not supported by this model's worker",
                                     field="prompt_logprobs")

    def build(self, req: canonical.InferenceRequest, target: base.Target) -> base.UpstreamRequest:
        body: dict[str, Any] = {"model": target.model}
        if req.messages is not None:
            body["messages"] = [self.message(m) for m in req.messages]
            path = self.CHAT_PATH
        else:
            body["prompt"] = _prompt(req.prompts or [""])
            path = self.COMPLETIONS_PATH
        self.sampling(req.sampling, body)
        self.limits(req.sampling, body)
        self.options(req, body)
        if req.per_token and req.top_logprobs and target.options.get("tokenizer"):
            self.top_ids(body)
        if req.extra:
            self.extras(req.extra, body)
        return base.UpstreamRequest(
            "POST", target.base_url.rstrip("/") + path, orjson.dumps(body),
            {"content-type": "application/json"}, streaming=req.stream)

    def extras(self, extra: dict[str, Any], body: dict[str, Any]) -> None:
        """Only the extras this worker declares go upstream (no mass assignment); fields the
        body already has are never overwritten."""
        dropped = []
        for key, value in extra.items():
            if key in self.EXTRA_FIELDS:
                body.setdefault(key, value)
            else:
                dropped.append(key)
        if dropped:
            _log.info("parameters_dropped", worker=type(self).__name__, fields=dropped,
                      why="not a field of this worker's API")

    def sampling(self, s: canonical.Sampling, body: dict[str, Any]) -> None:
        for attr, key in self.SAMPLING.items():
            value = getattr(s, attr)
            if value is not None and value != _UNSET.get(attr):
                body[key] = value

    def limits(self, s: canonical.Sampling, body: dict[str, Any]) -> None:
        """"As many tokens as fit" and "keep the matched stop string" in this worker's terms.
        A plain OpenAI server has neither: its own limit applies, and the TGI and LMI encoders
        put a matched stop string back where the worker reports which one matched."""

    def top_ids(self, body: dict[str, Any]) -> None:
        """Ask for the ids of the top alternatives (a tokenizer turns them into text); plain
        OpenAI servers have no such field."""

    def options(self, req: canonical.InferenceRequest, body: dict[str, Any]) -> None:
        """Everything that is not sampling: streaming, logprobs, tools, formats."""
        body["stream"] = req.stream
        if req.stream:
            body["stream_options"] = {"include_usage": True}  # usage is always wanted upstream
        if req.per_token and self.PER_TOKEN_LOGPROBS and not req.logprobs:
            body["logprobs"] = True if req.is_chat else 0  # the sampled token's alone
        if req.logprobs:
            if req.is_chat:
                body["logprobs"] = True
                if req.top_logprobs:
                    body["top_logprobs"] = req.top_logprobs
            else:
                body["logprobs"] = req.top_logprobs
        if req.echo:
            body["echo"] = True
        if req.tools is not None:
            body["tools"] = [_tool(t) for t in req.tools]
        if req.tool_choice is not None:
            body["tool_choice"] = _tool_choice(req.tool_choice)
        for key in ("parallel_tool_calls", "response_format", "reasoning_effort", "user"):
            if (value := getattr(req, key)) is not None:
                body[key] = value

    def message(self, m: canonical.Message) -> dict[str, Any]:
        out: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name is not None:
            out["name"] = m.name
        if m.tool_calls is not None:
            out["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls]
        if m.tool_call_id is not None:
            out["tool_call_id"] = m.tool_call_id
        return out

    def decoder(self, req: canonical.InferenceRequest, streaming: bool) -> base.StreamDecoder:
        return openai_decode.OpenAIDecoder(req.is_chat, streaming)

    def parse_error(self, status: int, body: bytes) -> errors.GatewayError:
        message = error_message(body) or f"the worker answered HTTP {status}"
        detail = body[:500].decode("utf-8", "replace")  # for the log line only
        if status >= 500:
            return errors.UpstreamUnavailable(message, status=503 if status == 503 else 502,
                                              detail=detail)
        return errors.UpstreamRejected(message, status=status, detail=detail)

    def health_path(self) -> str:
        return "/health"


def error_message(body: bytes) -> str:
    """The message of any OpenAI-style error body: nested, flat (trtllm-serve) or a string.
    A body that is not JSON (a proxy's HTML page) is no message for a client: empty."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or obj)
        return str(err)
    return str(obj)


def _prompt(prompts: list[str | list[int]]) -> str | list[str] | list[int] | list[list[int]]:
    if len(prompts) == 1:
        return prompts[0]
    return prompts  # type: ignore[return-value]


def _tool(t: canonical.ToolSpec) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": t.name}
    for key in ("description", "parameters", "strict"):
        if (value := getattr(t, key)) is not None:
            fn[key] = value
    return {"type": "function", "function": fn}


def _tool_choice(choice: str) -> str | dict[str, Any]:
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}
