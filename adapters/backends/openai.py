"""Any OpenAI-compatible worker: canonical requests to /v1/chat/completions and /v1/completions.

The parameter mapping is data, in the `Rule` idiom of params.py: a table per worker kind
(`OPENAI_*` here; vllm.py and trtllm.py extend it) in three parts whose order is the order of
the checks and the body's key order: sampling and request options (`TABLE`), then the client extras the worker declares
(`EXTRAS`, apart: a client's extra may be named like a canonical field, and goes as written). A canonical field
that is set but that the worker cannot honour is refused with a 4xx naming it, so a client
never gets a silently different answer.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import orjson

from adapters import base, chat_template, continuation
from adapters.backends import error_text, openai_decode, params
from adapters.backends.params import Drop, Own, Refuse, Send, Translate
from schemas import canonical, errors

# How this worker kind has always worded a refusal (no worker name, no reason).
NOT_SUPPORTED = "`{name}` is not supported by this model's worker"


# The value of a field that asks for nothing beyond a worker's default decoding: taken
# silently by a worker that has no such field. LMI clients send them as seed 003 documents
# the defaults (GenerationParameters: typical_p 1.0, num_beams 1, best_of 1, length_penalty
# 1.0, repetition_penalty 1.0, min_p 0.0, ignore_eos_token false, skip_special_tokens true).
NEUTRAL: dict[str, object] = {
    "typical_p": 1.0, "num_beams": 1, "best_of": 1, "length_penalty": 1.0,
    "repetition_penalty": 1.0, "min_p": 0.0, "min_tokens": 0, "ignore_eos": False,
    "skip_special_tokens": True,
}


def _top_k(v: int) -> dict[str, Any]:
    """vLLM's and LMI's "off" values, -1 and 0 (seed 003: default 0, vLLM block -1), ask
    nothing; any other is refused as a field this API does not have."""
    if v > 0:
        raise errors.Unsupported(NOT_SUPPORTED.format(name="top_k"), field="top_k")
    return {}


def unsupported(*names: str) -> dict[str, params.Rule]:
    out: dict[str, params.Rule] = {}
    for name in names:
        if name == "top_k":
            out[name] = Translate(_top_k)
        elif name in NEUTRAL:
            out[name] = Refuse("not an OpenAI API field", noop=NEUTRAL[name],
                               message=NOT_SUPPORTED)
        else:
            out[name] = Refuse("not an OpenAI API field", message=NOT_SUPPORTED)
    return out


# canonical Sampling field -> OpenAI request field (openai api-reference, chat/create).
OPENAI_SAMPLING: dict[str, params.Rule] = {
    "max_tokens": Send("max_tokens"),
    "temperature": Send("temperature"),
    "top_p": Send("top_p"),
    "presence_penalty": Send("presence_penalty"),
    "frequency_penalty": Send("frequency_penalty"),
    "seed": Send("seed"),
    "stop": Send("stop"),
    "n": Send("n"),
    "logit_bias": Send("logit_bias"),
    # "As many tokens as fit" and "keep the matched stop string": each worker says them in
    # its own terms (OpenAIBackend.limits), not by a rename.
    "max_tokens_fit": Own("limits()"),
    "keep_stop": Own("limits()"),
    **unsupported(*(n for n in canonical.Sampling.__slots__ if n not in (
        "max_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed",
        "stop", "n", "logit_bias", "max_tokens_fit", "keep_stop"))),
}


def _tools(v: list[canonical.ToolSpec]) -> dict[str, Any]:
    return {"tools": [_tool(t) for t in v]}


def _choice(v: str) -> dict[str, Any]:
    return {"tool_choice": _tool_choice(v)}


# The request's other options; `logprobs` / `top_logprobs` take a different form in chat and
# completions (OpenAIBackend.logprobs), written after `stream`.
OPENAI_OPTIONS: dict[str, params.Rule] = {
    "logprobs": Own("chat: `logprobs` + `top_logprobs`; completions: `logprobs: n`"),
    "top_logprobs": Own("with `logprobs`"),
    "echo": Send("echo"),
    "tools": Translate(_tools),
    "tool_choice": Translate(_choice),
    "parallel_tool_calls": Send("parallel_tool_calls"),
    "response_format": Send("response_format"),
    "reasoning_effort": Send("reasoning_effort"),
    "user": Send("user"),
    # (refused in this order)
    "token_ids": Refuse("no token ids", message="token ids are not available from this "
                        "model's worker"),
    # A client format with a logprob per token: asked for where the worker surely takes the
    # field (PER_TOKEN_LOGPROBS, written with `logprobs`); its ids where it gives them.
    "per_token": Own("with `logprobs`"),
    "prompt_logprobs": Refuse("no prompt logprobs", message=NOT_SUPPORTED),
}

# Request fields of OpenAI's API that the canonical model does not carry: the client extras an
# OpenAI-compatible worker declares (openai api-reference, chat/create and completions/create).
# Any other extra is dropped with a log line, never sent: a body's `api_key`, `api_base`,
# `base_url`, `extra_headers` or `upstream_model` must not reach a worker (issue 12).
OPENAI_EXTRAS: dict[str, params.Rule] = {
    **{name: Send() for name in (
        "max_tokens", "suffix", "store", "metadata", "service_tier", "modalities", "prediction",
        "audio", "web_search_options", "verbosity", "prompt_cache_key", "safety_identifier",
    )},
    # vLLM's token bans, which a client asks for by name (LMI `bad_sequences`, seed 003): not
    # OpenAI fields, and dropping them would change the answer unsaid (vLLM declares them).
    **{name: Refuse("not an OpenAI API field", message=NOT_SUPPORTED)
       for name in ("bad_words", "allowed_token_ids")},
    # vLLM's structured output (TGI's front end sends a regex `grammar` so): no OpenAI field
    # says it, and dropping it would answer unconstrained text.
    "structured_outputs": Refuse("not an OpenAI API field", message=NOT_SUPPORTED),
}
OPENAI_EXTRA_FIELDS = frozenset(OPENAI_EXTRAS)

# The BOS tokens of common tokenizers as a template may write them out: `<s>` (Llama 2,
# Mistral), `<bos>` (Gemma), `<|begin_of_text|>` (Llama 3), `<|startoftext|>`,
# `<｜begin▁of▁sentence｜>` (DeepSeek).
BOS_LIKE = re.compile(r"<[|｜]?(?:s|bos|begin_of_text|startoftext|begin▁of▁sentence)[|｜]?>")


class OpenAIBackend:
    """Speaks the OpenAI API as any compatible server does."""

    WORKER: ClassVar[str] = "openai"
    SAMPLING: ClassVar[dict[str, params.Rule]] = OPENAI_SAMPLING
    OPTIONS: ClassVar[dict[str, params.Rule]] = OPENAI_OPTIONS
    EXTRAS: ClassVar[dict[str, params.Rule]] = OPENAI_EXTRAS
    # An extra the worker does not declare is never sent (no mass assignment, issue 12).
    UNKNOWN_EXTRA: ClassVar[params.Rule] = Drop("not a field of this worker's API")
    TABLE: ClassVar[dict[str, params.Rule]] = {**SAMPLING, **OPTIONS}
    ACCEPTED_EXTRAS: ClassVar[frozenset[str]] = params.accepted_extras(EXTRAS, apart=True)
    CHAT_PATH: ClassVar[str] = "/v1/chat/completions"
    COMPLETIONS_PATH: ClassVar[str] = "/v1/completions"
    # Ask for logprobs when a client's format carries one per token (`per_token`) although
    # it did not ask: only where the worker surely takes the field.
    PER_TOKEN_LOGPROBS: ClassVar[bool] = False
    # A completion's length when `max_tokens` is absent: OpenAI's API reference (completions,
    # `max_tokens` defaults to 16) and vLLM's protocol.py (CompletionRequest.max_tokens = 16).
    COMPLETIONS_MAX_TOKENS: ClassVar[int | None] = 16
    # A chat continued through the completions route (`continuation`) keeps only the client
    # extras that mean the same there: none of OpenAI's chat fields does.
    COMPLETION_EXTRAS: ClassVar[frozenset[str]] = frozenset()

    # The plan `check` made, for the `build` that follows it: the serving path builds the
    # first attempt's request without yielding to the loop in between, so one slot, matched by
    # the request's identity, spares a second walk of the table (a continuation is a new
    # request, and a retry after other requests ran simply plans again).
    _checked: tuple[canonical.InferenceRequest, params.Plan] | None = None

    def check(self, req: canonical.InferenceRequest) -> None:
        self._checked = (req, params.plan(self.TABLE, req, self.WORKER, self.UNKNOWN_EXTRA,
                                          extras=self.extras(req), table_order=True))

    def extras(self, req: canonical.InferenceRequest) -> params.Table:
        """The client extras this worker declares for `req`'s route (here: both routes')."""
        return self.EXTRAS

    def build(self, req: canonical.InferenceRequest, target: base.Target) -> base.UpstreamRequest:
        checked = self._checked
        extras = self.extras(req)
        if checked is not None and checked[0] is req:
            fields = checked[1]  # dropped fields were logged by check()
        else:
            fields = params.plan(self.TABLE, req, self.WORKER, self.UNKNOWN_EXTRA,
                                 extras=extras, table_order=True, check=False)
        body: dict[str, Any] = {"model": target.model}
        if req.messages is not None:
            body["messages"] = [self.message(m) for m in req.messages]
            path = self.CHAT_PATH
        else:
            body["prompt"] = _prompt(req.prompts or [""])
            path = self.COMPLETIONS_PATH
        body.update(params.ordered(fields, self.SAMPLING))
        self.limits(req.sampling, body)
        body["stream"] = req.stream
        if req.stream:
            body["stream_options"] = self.stream_options(req)
        self.logprobs(req, body)
        body.update(params.ordered(fields, self.OPTIONS))
        if req.per_token and req.top_logprobs and target.options.get("tokenizer"):
            self.top_ids(body)
        for key, value in req.extra.items():  # as written, null included (`max_tokens: null`)
            rule = extras.get(key, self.UNKNOWN_EXTRA)
            if isinstance(rule, Send):
                body.setdefault(rule.key or key, value)
            elif isinstance(rule, Translate) and value is not None:
                for name, said in rule.fn(value).items():  # checked by check()
                    body.setdefault(name, said)
        return base.UpstreamRequest(  # positional (streaming last): no keywords' dict
            "POST", target.base_url.rstrip("/") + path, orjson.dumps(body),
            {"content-type": "application/json"}, req.stream)

    def stream_options(self, req: canonical.InferenceRequest) -> dict[str, Any]:
        """Usage is always wanted upstream (the log line, metrics, the client's usage chunk);
        a plain OpenAI server knows no more than that."""
        return {"include_usage": True}

    def limits(self, s: canonical.Sampling, body: dict[str, Any]) -> None:
        """"As many tokens as fit" and "keep the matched stop string" in this worker's terms.
        A plain OpenAI server has neither: its own limit applies, and the TGI and LMI encoders
        put a matched stop string back where the worker reports which one matched."""

    def top_ids(self, body: dict[str, Any]) -> None:
        """Ask for the ids of the top alternatives (a tokenizer turns them into text); plain
        OpenAI servers have no such field."""

    def logprobs(self, req: canonical.InferenceRequest, body: dict[str, Any]) -> None:
        """The `Own` rules of `logprobs` and `per_token`: chat's boolean with `top_logprobs`,
        completions' count."""
        if req.per_token and self.PER_TOKEN_LOGPROBS and not req.logprobs:
            body["logprobs"] = True if req.is_chat else 0  # the sampled token's alone
        if req.logprobs:
            if req.is_chat:
                body["logprobs"] = True
                if req.top_logprobs:
                    body["top_logprobs"] = req.top_logprobs
            else:
                body["logprobs"] = req.top_logprobs

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
        return openai_decode.OpenAIDecoder(req.is_chat, streaming,
                                           wants_prompt=req.prompt_logprobs is not None,
                                           choices=req.choice_count)

    def token_limit(self, req: canonical.InferenceRequest) -> int | None:
        """The client's `max_tokens` (or an extra `max_tokens` sent as written); without one,
        completions' default and, for chat or "as many as fit", the context's room."""
        s = req.sampling
        if s.max_tokens is not None:
            return s.max_tokens
        extra = req.extra.get("max_tokens")
        if type(extra) is int:
            return extra
        if s.max_tokens_fit or req.is_chat or "max_tokens" in req.extra:
            return None
        return self.COMPLETIONS_MAX_TOKENS

    def streams_whole(self, req: canonical.InferenceRequest) -> bool:
        """What only a non-streaming answer carries: prompt logprobs (vLLM protocol.py:
        "`prompt_logprobs` are not available when `stream=True`"), the echoed prompt's log
        probs, best_of > n and beam search (vLLM serving_completion.py: "Similar to the OpenAI
        API, when n != best_of, we do not stream the results. In addition, we do not stream the
        results when use beam search."; OpenAI's API reference, best_of: "Results cannot be
        streamed")."""
        s = req.sampling
        return not (req.prompt_logprobs is not None or (req.echo and req.logprobs)
                    or (s.best_of is not None and s.best_of > s.n)
                    or (s.num_beams or 1) > 1 or req.extra.get("use_beam_search"))

    def tokens_whole(self, req: canonical.InferenceRequest) -> bool:
        """Per-token logprobs show each token: the client's, or those asked for `per_token`
        where the worker surely takes the field (PER_TOKEN_LOGPROBS); a plain server's text
        alone does not. What only a body carries (`streams_whole` False) stays a body."""
        return req.logprobs or self.PER_TOKEN_LOGPROBS or not self.streams_whole(req)

    def parse_error(self, status: int, body: bytes) -> errors.GatewayError:
        message = error_text.message(body) or f"the worker answered HTTP {status}"
        detail = body[:500].decode("utf-8", "replace")  # for the log line only
        field = None
        if (reduced := error_text.reduce(message)) is not None:
            message, field = reduced  # not the body, dict reprs and file path it holds
        if field is None and 400 <= status < 500:
            field = error_text.param(body)
        if status >= 500:
            return errors.UpstreamUnavailable(message, status=503 if status == 503 else 502,
                                              detail=detail)
        if status == 429:  # this worker is busy (a rate limit in front of it), not the request
            # at fault: another upstream may take it, as TGI's `overloaded` (tgi_decode)
            return errors.UpstreamUnavailable(message, status=429, detail=detail)
        return errors.UpstreamRejected(message, field=field, status=status, detail=detail)

    def health_path(self) -> str:
        """The OpenAI API has no health route; `GET /v1/models` is the one request every
        OpenAI-compatible server answers (OpenAI's API reference, Models: List models), where
        `/health` is a 404 on many (OpenAI's own, Ollama, LM Studio). vLLM and trtllm-serve
        have their own `/health`."""
        return "/v1/models"

    def load_gauges(self) -> base.LoadGauges | None:
        return None  # the OpenAI API defines no load metrics

    def continuation(self, req: canonical.InferenceRequest, text_so_far: str,
                     tokens_so_far: int, options: base.Options = base.NO_OPTIONS
                     ) -> canonical.InferenceRequest | None:
        """A completion: the prompt plus the text so far. A chat: the OpenAI API has no way
        to continue an assistant turn, so with the model's `chat_template` it goes to the
        completions route as the chat rendered as Triton's is (adapters/chat_template.py,
        generation prompt added) plus the text so far (`continues` says when)."""
        if req.messages is None:
            return continuation.completion(req, text_so_far, tokens_so_far)
        if not self.continues(req, options):
            return None
        try:
            prompt, bos = chat_template.render_opening(str(options["chat_template"]),
                                                       req.messages)
        except errors.GatewayError:  # the worker's own template took what this one refuses
            return None
        flags = self.opening(prompt, bos)
        if flags is None:
            return None
        return continuation.chat_completion(req, prompt, text_so_far, tokens_so_far, flags)

    def continues(self, req: canonical.InferenceRequest,
                  options: base.Options = base.NO_OPTIONS) -> bool:
        """A chat is continued through the completions route only with a `chat_template`,
        and only what that route says the same way: no logprobs (they would come in
        completions' form, which carries no `bytes` and counts its alternatives otherwise:
        vLLM and trtllm-serve add the sampled token to a completion's `top_logprobs`),
        no `reasoning_effort` (a chat-template input), no extras but `COMPLETION_EXTRAS`,
        and a token limit where the route has a small default of its own (OpenAI's
        completions: 16, where a chat's is the context's room)."""
        if req.messages is None:
            return continuation.completion_possible(req)
        return (bool(options.get("chat_template")) and continuation.chat_possible(req)
                and not (req.logprobs or req.per_token) and req.reasoning_effort is None
                and req.extra.keys() <= self.COMPLETION_EXTRAS
                and (self.COMPLETIONS_MAX_TOKENS is None or req.sampling.max_tokens is not None))

    def opening(self, prompt: str, bos: bool) -> dict[str, object] | None:
        """The completions fields that give the rendered `prompt` the BOS the worker's chat
        route would have given it (its template's `bos_token`, `bos`), or None when this
        worker cannot be told. A plain OpenAI server declares no such field, and its
        completions route adds the tokenizer's BOS as vLLM's does (protocol.py
        CompletionRequest `add_special_tokens` default true): right when the template opens
        with `bos_token`; a prompt that opens with a BOS written out would get a second one,
        so that chat is not continued. Any other opening (ChatML's `<|im_start|>`, plain text)
        is continued: at worst a tokenizer that has a BOS puts one before it."""
        return None if not bos and BOS_LIKE.match(prompt) else {}


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
