"""OpenAI client protocol, response side: chunks, whole bodies and the error object as bytes.

The per-chunk path builds each chunk from a pre-encoded head and tail around one orjson.dumps
of the choice (for a text-only chunk, around the text's JSON body: `framing.json_body`), so a
chunk costs one serialisation at most and a few byte joins.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, assert_never

import orjson

from adapters import base, framing
from schemas import canonical, errors
from schemas import events as ev

# Id prefixes as OpenAI and vLLM write them.
CHAT_ID = "chatcmpl-"
COMPLETION_ID = "cmpl-"

# OpenAI has one "stop" for every natural end (openai-python ChatCompletionChunk finish_reason).
FINISH: dict[str, str] = {
    "eos": "stop", "stop_string": "stop", "stop_token": "stop", "length": "length",
    "tool_calls": "tool_calls", "content_filter": "content_filter", "abort": "abort",
    "error": "error",
}


# Elasticsearch's inference `openai` service: its HTTP client (x-pack inference
# external/http/HttpClient.java) is an Apache HttpAsyncClient built with no user agent, so it
# sends the library's default one (HttpAsyncClientBuilder.build:
# VersionInfo.getUserAgent("Apache-HttpAsyncClient", ...)).
ELASTICSEARCH_USER_AGENT = "Apache-HttpAsyncClient/"


def from_elasticsearch(headers: Mapping[str, str]) -> bool:
    """Whether a request comes from Elasticsearch's inference client. Another client of the
    same library is answered the same way, which costs it nothing (see _Chunks)."""
    return headers.get("user-agent", "").startswith(ELASTICSEARCH_USER_AGENT)


def usage_dict(u: ev.Usage) -> dict[str, int]:
    # OpenAI's key order: prompt, completion, total (api-reference, "usage" object).
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens}


def usage_with_details(u: ev.Usage) -> dict[str, Any]:
    """`usage_dict` with the detail objects a worker reported (vLLM's cached prompt tokens
    under --enable-prompt-tokens-details, reasoning tokens), in OpenAI's order after total."""
    out: dict[str, Any] = usage_dict(u)
    if u.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens}
    if u.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": u.reasoning_tokens}
    return out


def chat_logprobs(lps: list[ev.TokenLogprob] | None) -> list[dict[str, Any]]:
    return [
        {"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
         "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": a.bytes}
                          for a in t.top]}
        for t in lps or ()
    ]


def completion_logprobs(lps: list[ev.TokenLogprob] | None, offset: int) -> dict[str, Any]:
    """Legacy completions logprobs; `text_offset` runs on from `offset`."""
    tokens, values, tops, offsets = [], [], [], []
    for t in lps or ():
        tokens.append(t.token)
        values.append(t.logprob)
        tops.append({a.token: a.logprob for a in t.top} if t.top else None)
        offsets.append(offset)
        offset += len(t.token)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}


def uncovered(text: str, lps: list[ev.TokenLogprob] | None) -> int:
    """How much of an echoed answer's `text` its tokens do not cover: the prompt, where the
    worker gave no log probs for it. `text_offset` indexes the text the client gets, prompt
    included (vLLM serving_completion.py), so the tokens' offsets start after it."""
    return max(0, len(text) - sum(len(t.token) for t in lps or ()))


class _Chunks:
    """Pre-encoded chunk head and tail shared by the two stream encoders."""

    # OpenAI and vLLM both answer streams with this exact media type.
    media_type = "text/event-stream; charset=utf-8"
    headers: Mapping[str, str] = MappingProxyType({})
    holds_back = False  # `flush` is always b"" (base.StreamEncoder)

    def __init__(self, req: canonical.InferenceRequest, meta: base.ResponseMeta, obj: str,
                 id_prefix: str, text: tuple[bytes, bytes], null_usage: bool = True):
        head = b"".join((
            b'{"id":', orjson.dumps(id_prefix + meta.id), b',"object":"', obj.encode(), b'","created":',
            str(meta.created).encode(), b',"model":', orjson.dumps(meta.model), b',"choices":[',
        ))
        self._head = head
        self._prefix = b"data: " + head
        # openai api-reference: with include_usage, all other chunks carry "usage": null. Not
        # for Elasticsearch: 8.18 / 9.0 declare `usage` with declareObject, which refuses a JSON
        # null (OpenAiUnifiedStreamingProcessor); a missing key means the same to the OpenAI
        # SDK (ChatCompletionChunk.usage is Optional).
        null_usage = req.include_usage and null_usage
        self._suffix = (b'],"usage":null}' if null_usage else b"]}") + b"\n\n"
        self._include_usage = req.include_usage
        self._usage: ev.Usage | None = None
        self._generated = 0
        self._continuous = continuous = req.include_usage and req.continuous_usage
        # A chunk of text alone (no log probs or ids asked, no running usage): the bytes around
        # its text (`text`: the choice's, in `_text`'s key order, `%d` its index) made once per
        # choice, so a token costs its text's JSON body, not a dump of the dicts built for it.
        self._plain = not (req.logprobs or req.token_ids or continuous)
        self._text_open, self._text_tail = text[0], text[1] + self._suffix
        self._text_tail_quoted = b'"' + self._text_tail
        self._text_heads: dict[int, bytes] = {}  # each ends with the text's opening quote

    def _text_head(self, choice: int) -> bytes:
        """The bytes before a text-only chunk's text, made on its choice's first."""
        return self._text_heads.setdefault(choice,
                                           self._prefix + self._text_open % choice + b'"')

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        return (self._chunk_with_usage(choice) if self._continuous  # (a flag: a compiled
                else self._prefix + orjson.dumps(choice) + self._suffix)  # method is read-only)

    def _chunk_with_usage(self, choice: dict[str, Any]) -> bytes:
        """A chunk with the usage so far (vLLM's continuous_usage_stats, in vLLM's UsageInfo
        key order): the worker's counts where it sends them per chunk, else the prompt's
        once known and the tokens sent so far."""
        u = self._usage
        prompt = u.prompt_tokens if u is not None else 0
        done = max(u.completion_tokens if u is not None else 0, self._generated)
        usage = {"prompt_tokens": prompt, "total_tokens": prompt + done,
                 "completion_tokens": done}
        return (self._prefix + orjson.dumps(choice) + b'],"usage":' + orjson.dumps(usage)
                + b"}\n\n")

    def flush(self) -> bytes:
        return b""  # nothing is ever held back

    def fail(self, exc: errors.GatewayError) -> bytes:
        # vLLM (serving_chat.py): an error event, then [DONE]; openai-python raises on it.
        return framing.sse(orjson.dumps(error_object(exc))) + framing.SSE_DONE

    def finish(self) -> bytes:
        if not self._include_usage:
            return framing.SSE_DONE
        usage = self._usage or ev.Usage(0, self._generated)
        body = self._head + b'],"usage":' + orjson.dumps(usage_with_details(usage)) + b"}"
        return framing.sse(body) + framing.SSE_DONE


class ChatStreamEncoder(_Chunks):
    """chat.completion.chunk events: a role chunk per choice, deltas, a finish chunk."""

    def __init__(self, req: canonical.InferenceRequest, meta: base.ResponseMeta,
                 elasticsearch: bool = False):
        super().__init__(req, meta, "chat.completion.chunk", CHAT_ID,
                         (b'{"index":%d,"delta":{"content":',
                          b'},"logprobs":null,"finish_reason":null}'), not elasticsearch)
        self._started: set[int] = set()
        self._logprobs = req.logprobs
        self._token_ids = req.token_ids
        self._meta = meta

    def _role(self, choice: int) -> bytes:
        if choice in self._started:
            return b""
        self._started.add(choice)
        return self._chunk({"index": choice, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None})

    def encode(self, e: ev.Event) -> bytes:
        # `isinstance`, not `match`: the compiled build tests a class pattern through a lookup
        # of the class and a generic isinstance call, once an event
        if isinstance(e, ev.TextDelta):  # first: nearly every event is one
            if e.choice in self._started:
                return self._text(e)
            return self._role(e.choice) + self._text(e)
        if isinstance(e, ev.Role):
            return self._role(e.choice)
        if isinstance(e, ev.ReasoningDelta):
            return self._role(e.choice) + self._delta(e.choice, {"reasoning_content": e.text})
        if isinstance(e, ev.ToolCallDelta):
            call = _call(e, self._meta.delta_call_id(e))
            return self._role(e.choice) + self._delta(e.choice, {"tool_calls": [call]})
        if isinstance(e, ev.Finish):
            return self._role(e.choice) + self._chunk({
                "index": e.choice, "delta": {}, "logprobs": None,
                "finish_reason": FINISH[e.reason], "stop_reason": e.matched})
        if isinstance(e, ev.Usage):
            self._usage = e
            return b""
        if isinstance(e, ev.PromptInfo):
            return b""
        assert_never(e)

    def _delta(self, choice: int, delta: dict[str, Any]) -> bytes:
        return self._chunk({"index": choice, "delta": delta, "logprobs": None,
                            "finish_reason": None})

    def _text(self, e: ev.TextDelta) -> bytes:
        self._generated += len(e.token_ids) if e.token_ids is not None else 1
        if self._plain and type(e.choice) is int and type(e.text) is str:  # (`true` is no 1)
            return ((self._text_heads.get(e.choice) or self._text_head(e.choice))
                    + framing.json_body(e.text) + self._text_tail_quoted)
        c: dict[str, Any] = {"index": e.choice, "delta": {"content": e.text},
                             "logprobs": None, "finish_reason": None}
        if self._logprobs and e.logprobs is not None:
            c["logprobs"] = {"content": chat_logprobs(e.logprobs)}
        if self._token_ids:
            c["token_ids"] = e.token_ids
        return self._chunk(c)


def _call(e: ev.ToolCallDelta, call_id: str | None) -> dict[str, Any]:
    """A tool-call delta as vLLM and OpenAI stream it: id, type and name only on the first."""
    fn: dict[str, Any] = {}
    if e.name is not None:
        fn["name"] = e.name
    fn["arguments"] = e.arguments
    out: dict[str, Any] = {"index": e.index}
    if call_id is not None:
        out["id"] = call_id
        out["type"] = "function"
    out["function"] = fn
    return out


class CompletionStreamEncoder(_Chunks):
    """text_completion chunks; reasoning and tool calls have no place in this API."""

    def __init__(self, req: canonical.InferenceRequest, meta: base.ResponseMeta):
        super().__init__(req, meta, "text_completion", COMPLETION_ID,
                         (b'{"index":%d,"text":', b',"logprobs":null,"finish_reason":null}'))
        self._logprobs = req.logprobs
        self._token_ids = req.token_ids
        self._echo = req.echo
        self._offsets: dict[int, int] = {}

    def encode(self, e: ev.Event) -> bytes:
        if isinstance(e, ev.TextDelta):
            return self._text(e)
        if isinstance(e, ev.Finish):
            return self._chunk({"index": e.choice, "text": "", "logprobs": None,
                                "finish_reason": FINISH[e.reason], "stop_reason": e.matched})
        if isinstance(e, ev.Usage):
            self._usage = e
            return b""
        if isinstance(e, ev.Role | ev.ReasoningDelta | ev.ToolCallDelta | ev.PromptInfo):
            return b""
        assert_never(e)

    def _text(self, e: ev.TextDelta) -> bytes:
        self._generated += len(e.token_ids) if e.token_ids is not None else 1
        if self._plain and type(e.choice) is int and type(e.text) is str:  # (`true` is no 1)
            return ((self._text_heads.get(e.choice) or self._text_head(e.choice))
                    + framing.json_body(e.text) + self._text_tail_quoted)
        c: dict[str, Any] = {"index": e.choice, "text": e.text, "logprobs": None,
                             "finish_reason": None}
        if self._logprobs and e.logprobs is not None:
            offset = self._offsets.get(e.choice, 0)
            start = offset + uncovered(e.text, e.logprobs) if self._echo else offset
            c["logprobs"] = completion_logprobs(e.logprobs, start)
            self._offsets[e.choice] = offset + len(e.text)
        if self._token_ids:
            c["token_ids"] = e.token_ids
        return self._chunk(c)


def prompt_logprobs(info: ev.PromptInfo | None) -> list[dict[str, Any] | None] | None:
    """vLLM's `prompt_logprobs` (CompletionResponseChoice): per prompt position null (the
    first) or {"<token id>": {"logprob", "rank", "decoded_token"}}, the prompt's own token
    first, then the alternatives the worker gave, ranked by log prob."""
    if info is None or info.logprobs is None:
        return None
    out: list[dict[str, Any] | None] = []
    for pos, lp in enumerate(info.logprobs):
        if lp is None:
            out.append(None)
            continue
        rank = info.ranks[pos] if info.ranks is not None and pos < len(info.ranks) else None
        entry = {str(lp.id if lp.id is not None else -1):
                 {"logprob": lp.logprob, "rank": rank, "decoded_token": lp.token}}
        for n, a in enumerate(sorted(lp.top, key=lambda a: -a.logprob), 1):
            entry[str(a.id if a.id is not None else -1)] = {
                "logprob": a.logprob, "rank": n, "decoded_token": a.token}
        out.append(entry)
    return out


def _usage_or_count(done: canonical.Completion) -> dict[str, Any]:
    if done.usage is not None:
        return usage_with_details(done.usage)
    counted = sum(len(c.token_ids or ()) for c in done.choices)
    return usage_dict(ev.Usage(0, counted))


def _finish(c: canonical.Choice) -> tuple[str | None, str | int | None]:
    if c.finish is None:
        return None, None
    return FINISH[c.finish.reason], c.finish.matched


def chat_body(
    req: canonical.InferenceRequest, done: canonical.Completion, meta: base.ResponseMeta
) -> dict[str, Any]:
    """A whole chat.completion object."""
    choices = []
    for c in done.choices:
        msg: dict[str, Any] = {"role": "assistant",
                               "content": None if c.tool_calls and not c.text else c.text}
        if c.reasoning is not None:
            msg["reasoning_content"] = c.reasoning
        if c.tool_calls:
            msg["tool_calls"] = [{"id": meta.call_id(c.index, i, t.id, t.name), "type": "function",
                                  "function": {"name": t.name, "arguments": t.arguments}}
                                 for i, t in enumerate(c.tool_calls)]
        reason, matched = _finish(c)
        out: dict[str, Any] = {"index": c.index, "message": msg, "logprobs": None,
                               "finish_reason": reason, "stop_reason": matched}
        if req.logprobs:
            out["logprobs"] = {"content": chat_logprobs(c.logprobs)}
        if req.token_ids:
            out["token_ids"] = c.token_ids
        choices.append(out)
    body: dict[str, Any] = {"id": CHAT_ID + meta.id, "object": "chat.completion",
                            "created": meta.created, "model": meta.model, "choices": choices,
                            "usage": _usage_or_count(done)}
    if req.prompt_logprobs is not None:  # vLLM's, after usage (ChatCompletionResponse)
        body["prompt_logprobs"] = prompt_logprobs(done.prompt[0] if done.prompt else None)
    return body


def completion_body(
    req: canonical.InferenceRequest, done: canonical.Completion, meta: base.ResponseMeta
) -> dict[str, Any]:
    """A whole text_completion object; vLLM's prompt fields where the client asked for them."""
    prompts = {p.choice: p for p in done.prompt}
    choices = []
    for c in done.choices:
        reason, matched = _finish(c)
        out: dict[str, Any] = {"index": c.index, "text": c.text, "logprobs": None,
                               "finish_reason": reason, "stop_reason": matched}
        if req.logprobs:
            start = uncovered(c.text, c.logprobs) if req.echo else 0
            out["logprobs"] = completion_logprobs(c.logprobs, start)
        if req.token_ids:
            out["token_ids"] = c.token_ids
        info = prompts.get(c.index)
        if req.prompt_logprobs is not None:
            out["prompt_logprobs"] = prompt_logprobs(info)
        if req.token_ids:
            out["prompt_token_ids"] = info.token_ids if info is not None else None
        choices.append(out)
    return {"id": COMPLETION_ID + meta.id, "object": "text_completion", "created": meta.created,
            "model": meta.model, "choices": choices, "usage": _usage_or_count(done)}


# ---- errors: OpenAI's error object, `code` a string (openai-python ErrorObject) ----

_ERROR_TYPES: dict[type[errors.GatewayError], tuple[str, str | None]] = {
    errors.InvalidRequest: ("invalid_request_error", None),
    errors.Unauthorized: ("invalid_request_error", "invalid_api_key"),
    errors.ModelNotFound: ("invalid_request_error", "model_not_found"),
    # OpenAI's API on a path it has no route for: 404, code "unknown_url"
    errors.MethodNotAllowed: ("invalid_request_error", "method_not_allowed"),
    errors.NoRoute: ("invalid_request_error", "unknown_url"),
    errors.PayloadTooLarge: ("invalid_request_error", "request_too_large"),
    errors.Overloaded: ("rate_limit_error", "rate_limit_exceeded"),
    errors.Unsupported: ("invalid_request_error", "unsupported_parameter"),
    errors.RequestError: ("invalid_request_error", None),
    errors.UpstreamRejected: ("invalid_request_error", None),
    errors.UpstreamUnavailable: ("server_error", "upstream_unavailable"),
    errors.UpstreamTimeout: ("server_error", "upstream_timeout"),
    errors.UpstreamBroken: ("server_error", "upstream_error"),
    errors.UpstreamError: ("server_error", "upstream_error"),
    errors.GatewayError: ("server_error", "internal_error"),
}


def error_object(exc: errors.GatewayError) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}` for any gateway error; every 429 (the
    gateway's limit, or the workers' own) has OpenAI's rate-limit code."""
    cls = errors.Overloaded if exc.status == 429 else type(exc)
    kind, code = next(_ERROR_TYPES[c] for c in cls.__mro__ if c in _ERROR_TYPES)
    return {"error": {"message": exc.message, "type": kind, "param": exc.field, "code": code}}


def render_error(exc: errors.GatewayError) -> base.Rendered:
    return base.Rendered(exc.status, orjson.dumps(error_object(exc)),
                         headers=base.retry_headers(exc))
