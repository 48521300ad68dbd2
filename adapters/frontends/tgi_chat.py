"""TGI's Messages API on /v1/chat/completions: how the OpenAI chat front end reads and answers
TGI's clients.

TGI serves one model whatever a client calls it, so its clients name none or a placeholder:
"tgi" (text_generation's Client.chat) or "dummy" (huggingface_hub's InferenceClient with a
base_url). Such a request is read as TGI reads it (`null` for any optional field, TGI's
GrammarType `response_format`, a bare function name as `tool_choice`) and answered in TGI's
chat shape (lib.rs ChatCompletion / ChatCompletionChunk / CompletionType, chat.rs
create_event_from_stream_token, server.rs chat_completions @ db931fcf): `object` first, an empty
`id`, a string `system_fingerprint` (text_generation's ChatComplete and ChatCompletionChunk
require one), `role` in every delta, `usage: null` on every chunk, finish reasons `stop`,
`stop_sequence` and `length`. Requests naming a real model are plain OpenAI (openai.py decides,
with `placeholder`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard, assert_never

import orjson
from pydantic import ValidationError

from adapters import base, framing
from adapters.frontends import openai_encode, openai_parse, tgi, tgi_encode
from schemas import canonical, errors
from schemas import events as ev
from schemas import tgi as wire

# The model names TGI's clients send for "the one model" (SPEC.md, TGI front end). Here is the
# one place they (and a missing name) are resolved: to the default model, answered in TGI's
# shape; the router knows real names and aliases only.
PLACEHOLDERS = frozenset({"tgi", "dummy"})

# FinishReason.format(true) (lib.rs): only eos_token becomes "stop"; TGI reports a tool call
# as the end of sequence it is.
FINISH: dict[str, str] = {
    "eos": "stop", "stop_token": "stop", "stop_string": "stop_sequence", "length": "length",
    "tool_calls": "stop", "content_filter": "stop", "abort": "stop", "error": "stop",
}

_FINGERPRINT = orjson.dumps(tgi.SYSTEM_FINGERPRINT)


def placeholder(model: Any) -> bool:
    """Whether a chat request's `model` stands for the default model, the TGI client's way:
    none, "tgi" (text_generation's Client.chat) or "dummy" (huggingface_hub's InferenceClient)."""
    return model is None or (isinstance(model, str) and model in PLACEHOLDERS)


# The note on a refused TGI chat request (see `refusal`); a note, not a subclass: the error
# tree is the same for every protocol.
REFUSED = "a TGI client's chat request, refused in TGI's form"
REFUSED_STREAM = "a TGI client's streaming chat request, refused in TGI's form"
# TGI's InferError::ToolError, raised by try_into_generate before any stream begins: 422 and
# `error_type: tool_error` for streaming requests too (server.rs chat_completions `?`).
REFUSED_TOOLS = "a TGI client's chat request, refused as TGI's tool error"


def chat_request(data: dict[str, Any]) -> canonical.InferenceRequest:
    """A TGI client's chat body (a decoded JSON object) in canonical form, for the default
    model, which answers under its own name. Checked as TGI checks the generate request it
    makes of it (`check`); a refusal carries a note saying so (`refusal` renders it)."""
    try:
        check_tools(data)
        checked = check(data)
        out = as_openai(data)
        # Values TGI takes beyond OpenAI's ranges (a temperature above 2, a presence penalty
        # above 2): TGI's checks passed, OpenAI's are skipped for them.
        wide = {k: out.pop(k) for k in ("temperature", "presence_penalty")
                if checked and _number(out.get(k))}  # anything else: OpenAI's reading refuses
        req = openai_parse.chat_request(out)
    except errors.RequestError as exc:
        if REFUSED_TOOLS not in getattr(exc, "__notes__", ()):
            exc.add_note(REFUSED_STREAM if data.get("stream") is True else REFUSED)
        raise
    if "temperature" in wide:
        req.sampling.temperature = float(wide["temperature"])
    s = req.sampling
    presence = float(wide["presence_penalty"]) if "presence_penalty" in wide \
        else s.presence_penalty
    if presence is not None:  # TGI's meaning (try_into_generate), not OpenAI's additive one
        s.repetition_penalty, s.presence_penalty = presence + 2.0, None
    req.model = None
    return req


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


def check_tools(data: dict[str, Any]) -> None:
    """TGI's tool errors, checked (lib.rs `try_into_generate`, infer/tool_grammar.rs
    `find_tool_by_name`) before the generate request is validated: tools with a
    `response_format`, or a named `tool_choice` (a bare name or `{"function": {"name"}}`)
    that no tool has. Bodies TGI would not deserialize are left to the OpenAI reading."""
    tools = data.get("tools")
    if not isinstance(tools, list):
        return  # null or absent: try_into_generate never looks at tool_choice
    if data.get("response_format") is not None:
        raise _tool_error("Grammar and tools are mutually exclusive", "response_format")
    choice = data.get("tool_choice")
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else choice
    if not isinstance(name, str) or (choice is name and name in ("auto", "none", "required")):
        return
    if not any(isinstance(t, dict) and isinstance(t.get("function"), dict)
               and t["function"].get("name") == name for t in tools):
        raise _tool_error(f"Tool with name {name} not found", "tool_choice")


def _tool_error(message: str, field: str) -> errors.InvalidRequest:
    exc = errors.InvalidRequest(message, field=field)
    exc.add_note(REFUSED_TOOLS)
    return exc


def check(data: dict[str, Any]) -> bool:
    """TGI's checks of a chat request: lib.rs `try_into_generate` makes a GenerateRequest of it
    (temperature 0 is greedy and no temperature, `repetition_penalty` is presence_penalty + 2,
    max_tokens is `max_new_tokens`, top_logprobs `top_n_tokens`), which server.rs
    chat_completions hands to generate(_stream)_internal, so validation.rs `validate` checks
    it with its messages (the TGI front end's `tgi.check`): e.g. top_p 1.0 is refused. Values
    of a type TGI would not read are left to the OpenAI reading (False)."""
    temperature, presence = data.get("temperature"), data.get("presence_penalty")
    max_tokens = data.get("max_tokens")
    fields = {
        "temperature": None if temperature == 0 else temperature,
        "repetition_penalty": presence + 2.0 if _number(presence) else None,
        "frequency_penalty": data.get("frequency_penalty"), "top_p": data.get("top_p"),
        "max_new_tokens": data.get("max_completion_tokens") if max_tokens is None else max_tokens,
        "stop": data.get("stop") if isinstance(data.get("stop"), list) else None,
        "top_n_tokens": data.get("top_logprobs")}
    if not all(v is None or isinstance(v, list) or _number(v) for v in fields.values()):
        return False
    try:
        p = wire.GenerateParameters.model_validate(fields)
    except ValidationError:
        return False
    tgi.check("chat", p, temperature != 0, 1)  # the chat template's output is never empty
    return True


@dataclass(slots=True)
class ChatTranslator:
    """One chat completion of a TGI client, answered in TGI's chat shape, errors too."""

    request: canonical.InferenceRequest

    def encoder(self, meta: base.ResponseMeta) -> base.StreamEncoder:
        return ChatStreamEncoder(self.request, meta)

    def render(self, done: canonical.Completion, meta: base.ResponseMeta) -> base.Rendered:
        return base.Rendered(200, orjson.dumps(chat_body(self.request, done, meta)))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        return render_error(exc, self.request.stream)


def render_error(exc: errors.GatewayError, stream: bool) -> base.Rendered:
    """TGI's chat errors (server.rs chat_completions): without streaming TGI's ErrorResponse
    with its status (422 `Input validation error: ...`); a stream checks inside itself
    (generate_stream_internal), so HTTP 200, the error event of infer/mod.rs
    `into_openai_event` and `data: [DONE]`. What the gateway refuses before TGI's handler (API
    key, body size, ...) keeps its status and JSON body."""
    r = tgi_encode.render_error(exc, in_stream=stream)
    if r.status != 200:
        return r
    return base.Rendered(200, error_event(exc), r.media_type, r.headers)


def refusal(exc: errors.GatewayError) -> base.Rendered | None:
    """A refusal of `chat_request` rendered in TGI's form (None for any other error), for the
    front end that parses /v1/chat/completions."""
    notes = getattr(exc, "__notes__", ())
    if REFUSED_TOOLS in notes:
        return base.Rendered(422, orjson.dumps({"error": f"Tool error: {exc.message}",
                                                "error_type": "tool_error"}))
    if REFUSED in notes or REFUSED_STREAM in notes:
        return render_error(exc, REFUSED_STREAM in notes)
    return None


def error_event(exc: errors.GatewayError) -> bytes:
    """InferError::into_openai_event (infer/mod.rs): always http_status_code 422; `[DONE]`
    follows (server.rs chat_completions)."""
    message = tgi_encode.error_parts(exc)[2]
    body = orjson.dumps({"error": {"message": message, "http_status_code": 422}})
    return framing.sse(body) + framing.SSE_DONE


def as_openai(data: dict[str, Any]) -> dict[str, Any]:
    """A TGI ChatRequest as the OpenAI request it means."""
    out = {k: v for k, v in data.items() if v is not None and k != "tool_prompt"}
    if isinstance(out.get("logit_bias"), list):
        del out["logit_bias"]  # TGI's Vec<f32> form, which TGI marks UNUSED
    if out.get("top_logprobs") and not out.get("logprobs"):
        del out["top_logprobs"]  # TGI returns no logprobs then, and does not refuse it
    if out.get("tools") is None:
        out.pop("tool_choice", None)  # lib.rs try_into_generate reads it only with tools
    choice = out.get("tool_choice")
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        out["tool_choice"] = {"type": "function", "function": {"name": choice}}  # lib.rs
    fmt = out.get("response_format")
    if isinstance(fmt, dict) and "value" in fmt:
        _grammar(out, fmt)
    if isinstance(out.get("messages"), list):
        out["messages"] = [_message(m) for m in out["messages"]]
    return out


def _message(m: Any) -> Any:
    """A TGI Message as OpenAI's: a tool call's `arguments` (or its alias `parameters`) is any
    JSON value in TGI (lib.rs FunctionDefinition, `arguments: serde_json::Value`), a JSON string
    in OpenAI's; huggingface_hub types it `Any`, so an object is sent as its compact JSON text
    (serde_json's `to_string`, TGI's `serialize_as_string`)."""
    calls = m.get("tool_calls") if isinstance(m, dict) else None
    if not isinstance(calls, list):
        return m
    return {**m, "tool_calls": [_call(c) for c in calls]}


def _call(c: Any) -> Any:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or isinstance(fn.get("arguments"), str):
        return c
    fn = dict(fn)
    alias = fn.pop("parameters", None)
    args = fn.pop("arguments", alias)
    if args is not None:
        fn["arguments"] = args if isinstance(args, str) else orjson.dumps(args).decode()
    return {**c, "function": fn}


def _grammar(out: dict[str, Any], fmt: dict[str, Any]) -> None:
    """TGI's `{"type": "json" | "json_object" | "json_schema" | "regex", "value": ...}`
    (huggingface_hub sends `{"type": "json_object", "value": schema}`)."""
    kind, value = fmt.get("type"), fmt.get("value")
    del out["response_format"]
    if kind == "regex":
        out["structured_outputs"] = {"regex": value}
        return
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise errors.InvalidRequest(f"grammar is not valid: {exc}",
                                        field="response_format") from None
    if kind == "json_schema" and isinstance(value, dict) and "schema" in value:
        spec = {"name": value.get("name") or "response_format", "schema": value["schema"]}
    else:
        spec = {"name": "response_format", "schema": value}
    out["response_format"] = {"type": "json_schema", "json_schema": spec}


def _logprobs(lps: list[ev.TokenLogprob] | None) -> dict[str, Any] | None:
    """ChatCompletionLogprobs (lib.rs): token, f32 logprob, top_logprobs; no bytes."""
    if lps is None:
        return None
    return {"content": [
        {"token": t.token, "logprob": tgi_encode.f32(t.logprob),
         "top_logprobs": [{"token": a.token, "logprob": tgi_encode.f32(a.logprob)}
                          for a in t.top]} for t in lps]}


class ChatStreamEncoder:
    """TGI's chat.completion.chunk events, then `data: [DONE]` (also after an error). TGI
    writes the finish reason on the last token's own chunk (chat.rs
    create_event_from_stream_token): a token's chunk waits for the end of its batch, where the
    worker's finish comes with the last token, and takes the finish reason when it does."""

    media_type = tgi_encode.SSE_MEDIA_TYPE
    headers: Mapping[str, str] = tgi_encode.SSE_HEADERS  # axum's Sse and TGI's

    def __init__(self, req: canonical.InferenceRequest, meta: base.ResponseMeta):
        self._head = (b'{"object":"chat.completion.chunk","id":"","created":'
                      + str(meta.created).encode() + b',"model":' + orjson.dumps(meta.model)
                      + b',"system_fingerprint":' + _FINGERPRINT + b',"choices":[')
        self._logprobs = req.logprobs
        self._include_usage = req.include_usage
        self._usage: ev.Usage | None = None
        self._generated = 0
        self._held: tuple[int, str, Any] | None = None  # a token's chunk: choice, text, logprobs
        self._meta = meta

    def _chunk(self, choice: int, delta: dict[str, Any], logprobs: Any = None,
               finish: str | None = None) -> bytes:
        c = {"index": choice, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return b"data: " + self._head + orjson.dumps(c) + b'],"usage":null}\n\n'

    def encode(self, e: ev.Event) -> bytes:
        if isinstance(e, ev.TextDelta):
            self._generated += len(e.token_ids) if e.token_ids is not None else 1
            out = self.flush()
            self._held = (e.choice, e.text, _logprobs(e.logprobs) if self._logprobs else None)
            return out
        if isinstance(e, ev.ReasoningDelta):
            return self.flush() + self._chunk(e.choice,
                                              {**_text(""), "reasoning_content": e.text})
        if isinstance(e, ev.ToolCallDelta):
            # DeltaToolCall (lib.rs): id and type on every fragment, name only on the first;
            # where the worker gave no id, the first carries a made one (ResponseMeta).
            call = {"index": e.index, "id": self._meta.delta_call_id(e) or "",
                    "type": "function",
                    "function": {"name": e.name, "arguments": e.arguments}}
            return self.flush() + self._chunk(e.choice,
                                              {"role": "assistant", "tool_calls": [call]})
        if isinstance(e, ev.Finish):
            # TGI's last token carries the finish reason, and a stop sequence's text: TGI
            # keeps it (StopSequenceCriteria), the canonical text never has it.
            stop = e.matched if e.reason == "stop_string" and isinstance(e.matched, str) \
                else ""
            held = self._held
            if held is not None and held[0] == e.choice:  # the last token's own chunk
                self._held = None
                return self._chunk(e.choice, _text(held[1] + stop), held[2],
                                   FINISH[e.reason])
            return self.flush() + self._chunk(e.choice, _text(stop), None, FINISH[e.reason])
        if isinstance(e, ev.Usage):
            self._usage = e
            return b""
        if isinstance(e, ev.Role | ev.PromptInfo):
            return b""  # no role-only chunk: every delta carries the role
        assert_never(e)

    def flush(self) -> bytes:
        """The held token's chunk, at the end of its batch."""
        if self._held is None:
            return b""
        (choice, text, lps), self._held = self._held, None
        return self._chunk(choice, _text(text), lps)

    def fail(self, exc: errors.GatewayError) -> bytes:
        return self.flush() + error_event(exc)

    def finish(self) -> bytes:
        if not self._include_usage:
            return framing.SSE_DONE
        usage = self._usage or ev.Usage(0, self._generated)
        body = self._head + b'],"usage":' + orjson.dumps(openai_encode.usage_dict(usage)) + b"}"
        return framing.sse(body) + framing.SSE_DONE


def _text(text: str) -> dict[str, Any]:
    """A TextMessage delta, as TGI 3 writes it (chat.rs): no `tool_calls` key. (text_generation
    0.7.0's ChoiceDelta would want `tool_calls: null`, but Elasticsearch 8.19/9.x's streaming
    parser refuses a null there, and that client cannot be installed beside huggingface_hub 1+.)"""
    return {"role": "assistant", "content": text}


def chat_body(req: canonical.InferenceRequest, done: canonical.Completion,
              meta: base.ResponseMeta) -> dict[str, Any]:
    """ChatCompletion under CompletionType's `object` tag (lib.rs)."""
    choices = []
    for c in done.choices:
        msg: dict[str, Any] = {"role": "assistant",
                               "content": tgi_encode.with_stop(c.text, c.finish)}
        if c.tool_calls:  # ToolCallMessage: no content; FunctionDefinition with description
            msg = {"role": "assistant", "tool_calls": [
                {"id": meta.call_id(c.index, i, t.id, t.name), "type": "function",
                 "function": {"description": None, "name": t.name, "arguments": t.arguments}}
                for i, t in enumerate(c.tool_calls)]}
        if c.reasoning is not None:
            msg["reasoning_content"] = c.reasoning
        choices.append({"index": c.index, "message": msg,
                        "logprobs": _logprobs(c.logprobs or []) if req.logprobs else None,
                        "finish_reason": FINISH[c.finish.reason] if c.finish else "length"})
    usage = done.usage or ev.Usage(0, sum(len(c.token_ids or ()) for c in done.choices))
    return {"object": "chat.completion", "id": "", "created": meta.created, "model": meta.model,
            "system_fingerprint": tgi.SYSTEM_FINGERPRINT, "choices": choices,
            "usage": openai_encode.usage_dict(usage)}
