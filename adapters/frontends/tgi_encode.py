"""TGI client protocol, response side: /generate bodies, /generate_stream events, error bodies.

Byte sources, TGI router @ db931fcf (v3.3.7): `lib.rs` for field order and omissions
(GenerateResponse, Details, BestOfSequence, StreamResponse, StreamDetails, Token, PrefillToken),
`server.rs` for `generate_internal` (return_full_text, best_of), `generate_stream_internal`
(index from 1, generated_text and details only on the last event, no terminator) and
`From<InferError>` (error statuses and types); axum >= 0.7 SSE framing (`data: ` with one space,
wire-formats.md 4.4). The per-token path is one orjson.dumps per token and a few byte joins.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, assert_never

import orjson

from adapters import base, framing
from schemas import canonical, errors
from schemas import events as ev

# TGI's FinishReason has three values (lib.rs); a stop token id is an end-of-sequence token.
FINISH: dict[str, str] = {
    "eos": "eos_token", "stop_token": "eos_token", "stop_string": "stop_sequence",
    "length": "length", "tool_calls": "eos_token", "content_filter": "eos_token",
    "abort": "eos_token", "error": "eos_token",
}

# "Unknown": an id neither the worker nor the model's tokenizer gave (SPEC.md, adapters/tokens.py);
# TGI ids are u32, so -1 is never a real one, and clients read it as an int (text_generation).
UNKNOWN_ID = -1

_F32 = struct.Struct("<f")
_pack, _unpack = _F32.pack, _F32.unpack
_F32_MIN_NORMAL = 2.0**-126


@dataclass(slots=True)
class TgiState:
    """What a TGI request asked to be rendered; kept by its translator (tgi.TgiTranslator)."""

    details: bool = False  # `details` or `decoder_input_details` (server.rs generate_internal)
    prefill: bool = False  # `decoder_input_details`: details.prefill is filled
    top_n_tokens: int = 0
    best_of: int = 1
    seed: int | None = None  # reported seed: the client's, when sampling (greedy reports null)
    prefix: str = ""  # the prompt when `return_full_text`, prepended to generated_text
    wrap: bool = False  # POST / non-stream: the body inside a one-element array


def f32(x: float | None) -> float | None:
    """A logprob as TGI writes its f32: the shortest digits that read back as the same f32
    (serde_json uses ryu), e.g. -0.9719473 where the double prints -0.9719473123550415
    (wire-formats.md 4.3). Returned as the double of those digits, which orjson (ryu too, with
    the same notation rules below 1e13) writes with the same bytes. Non-finite -> null, as
    serde_json writes a NaN."""
    if x is None:
        return None
    try:
        y: float = _unpack(_pack(x))[0]
    except OverflowError:
        return None
    if y - y != 0.0:  # inf or nan
        return None
    if y and -_F32_MIN_NORMAL < y < _F32_MIN_NORMAL:  # subnormal (never a logprob)
        return next(v for v in (float(format(y, f".{p}g")) for p in range(1, 10))
                    if _unpack(_pack(v))[0] == y)
    # Rounded to k significant digits, a normal f32 reads back once k digits suffice, and
    # for k <= 6 that rounding is the shortest form (the f32 rounding interval is narrower
    # than the spacing of 6-digit decimals). Most logprobs need 7 or 8 digits; 9 always do.
    v = float(format(y, ".7g"))
    if _unpack(_pack(v))[0] == y:
        v6 = float(format(y, ".6g"))
        return v6 if _unpack(_pack(v6))[0] == y else v
    v = float(format(y, ".8g"))
    return v if _unpack(_pack(v))[0] == y else float(format(y, ".9g"))


def finish_reason(finish: ev.Finish | None) -> str:
    return FINISH[finish.reason] if finish is not None else "length"


def with_stop(text: str, finish: ev.Finish | None) -> str:
    """TGI keeps a matched stop sequence in generated_text (its StopSequenceCriteria ends after
    the match); a worker that strips it gets it back here."""
    return text + stop_tail(text, finish)


def stop_tail(text: str, finish: ev.Finish | None) -> str:
    """The matched stop sequence a worker stripped from `text` (OpenAI servers do), which TGI's
    text ends with, as do its tokens (the last completed the match); else ""."""
    if finish is not None and finish.reason == "stop_string" and isinstance(finish.matched, str) \
            and not text.endswith(finish.matched):
        return finish.matched
    return ""


def stop_token(text: str) -> dict[str, Any]:
    """The token that completed a stop sequence a worker stripped: id and log prob unknown."""
    return {"id": UNKNOWN_ID, "text": text, "logprob": None, "special": False}


_NONE: frozenset[int] = frozenset()


def special_ids(meta: base.ResponseMeta) -> frozenset[int]:
    """The model's special token ids, from its tokenizer (`models[].tokenizer`); none known
    without one (workers do not say which tokens are special), so `special` is false then."""
    ids = meta.options.get("special_token_ids")
    return ids if isinstance(ids, frozenset) else _NONE


def token(tid: int, text: str, lp: ev.TokenLogprob | None,
          special: frozenset[int] = _NONE) -> dict[str, Any]:
    """`Token` (lib.rs). `special` as TGI's shard sets it, `all_special_ids.contains(id)`
    (flash_causal_lm.py generate_token): a TGI worker's own flag, with its text (`</s>`:
    decode_token keeps special tokens, which the generated text leaves out); else as the
    model's tokenizer says."""
    if lp is not None and lp.special is not None:
        flag = lp.special
        text = lp.token if flag and lp.token else text
    else:
        flag = tid in special
    return {"id": tid, "text": text, "logprob": f32(lp.logprob) if lp is not None else None,
            "special": flag}


def top_tokens(lp: ev.TokenLogprob | None, tid: int, k: int, special: frozenset[int] = _NONE,
               flag: bool = False) -> list[dict[str, Any]]:
    """The k most likely tokens at a position, best first (TGI's batch_top_tokens); the sampled
    token among them has its own `flag`."""
    if lp is None or not k or not lp.top:
        return []
    alts = sorted(lp.top, key=lambda a: -a.logprob)[:k]
    out = []
    for a in alts:
        aid = a.id if a.id is not None else (tid if a.token == lp.token else UNKNOWN_ID)
        out.append({"id": aid, "text": a.token, "logprob": f32(a.logprob),
                    "special": flag if aid == tid else aid in special})
    return out


_MORE = b',"generated_text":null,"details":null}\n\n'
# A last event with no token to carry: TGI always has one, so an empty special token stands in.
_EMPTY_TOKEN = {"id": UNKNOWN_ID, "text": "", "logprob": None, "special": True}


SSE_MEDIA_TYPE = "text/event-stream"
# axum's Sse (response/sse.rs): cache-control; server.rs generate_stream_internal: the other
SSE_HEADERS: Mapping[str, str] = MappingProxyType({"cache-control": "no-cache",
                                                   "x-accel-buffering": "no"})


class StreamEncoder:
    """/generate_stream events. The last event must carry generated_text and details, and
    only the Finish (and the usage that gives `input_length`) says which token was last, so
    the newest token is held, but only until the end of the upstream read it came in
    (`flush`): vLLM sends the last token with its finish_reason, and usage right after, so the
    last token stays held until its usage. Should a worker send a Finish in a read of its own,
    the final event carries an empty token instead (TGI never does that; time to first token
    matters more)."""

    media_type = SSE_MEDIA_TYPE
    headers: Mapping[str, str] = SSE_HEADERS

    def __init__(self, st: TgiState, special: frozenset[int] = _NONE):
        self._st = st
        self._special = special
        self._index = 0
        self._held: bytes | None = None  # the newest token's event, without its tail
        self._text: list[str] = []
        self._tokens = 0
        self._finish: ev.Finish | None = None
        self._input_length = 0
        self._ended = False

    def encode(self, e: ev.Event) -> bytes:
        if isinstance(e, ev.TextDelta):
            return self._delta(e) if e.choice == 0 and not self._ended else b""
        if isinstance(e, ev.Finish):
            if e.choice == 0:
                self._finish = e
            return b""
        if isinstance(e, ev.Usage):
            self._input_length = e.prompt_tokens
            return self._end() if self._finish is not None else b""
        if isinstance(e, ev.PromptInfo):
            if e.choice == 0 and e.token_ids is not None and not self._input_length:
                self._input_length = len(e.token_ids)
            return b""
        if isinstance(e, ev.Role | ev.ReasoningDelta | ev.ToolCallDelta):
            return b""
        assert_never(e)

    def _delta(self, e: ev.TextDelta) -> bytes:
        out = self._release()
        ids, lps = e.token_ids, e.logprobs
        if not self._st.top_n_tokens and (len(ids) == 1 if ids else not lps):  # one token
            lp = lps[0] if lps else None
            self._index += 1
            self._held = b'{"index":%d,"token":%s' % (self._index, orjson.dumps(
                token(ids[0] if ids else UNKNOWN_ID, e.text, lp, self._special)))
            self._text.append(e.text)
            self._tokens += 1
            return out
        heads = [self._head(t) for t in e.per_token(UNKNOWN_ID)]
        self._text.append(e.text)
        self._tokens += len(heads)
        for h in heads[:-1]:
            out += b"data: " + h + _MORE
        self._held = heads[-1]
        return out

    def _head(self, t: tuple[int, str, ev.TokenLogprob | None]) -> bytes:
        self._index += 1  # server.rs: `index += 1` before the first event, so it starts at 1
        tok = token(*t, self._special)
        head = b'{"index":' + str(self._index).encode() + b',"token":' + orjson.dumps(tok)
        if tops := top_tokens(t[2], t[0], self._st.top_n_tokens, self._special, tok["special"]):
            head += b',"top_tokens":' + orjson.dumps(tops)
        return head

    def _release(self) -> bytes:
        if self._held is None:
            return b""
        out, self._held = b"data: " + self._held + _MORE, None
        return out

    def _end(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        text = self._st.prefix + "".join(self._text)
        out = b""
        if tail := stop_tail(text, self._finish):  # the stop sequence a worker stripped: the
            out, text = self._release(), text + tail  # token that completed it comes last
            self._tokens += 1
        head = self._held
        if head is None:
            self._index += 1
            head = b'{"index":' + str(self._index).encode() + b',"token":' + orjson.dumps(
                stop_token(tail) if tail else _EMPTY_TOKEN)
        self._held = None
        details = None
        if self._st.details:  # StreamDetails (lib.rs)
            details = {"finish_reason": finish_reason(self._finish),
                       "generated_tokens": self._tokens, "seed": self._st.seed,
                       "input_length": self._input_length}
        return (out + b"data: " + head + b',"generated_text":' + orjson.dumps(text)
                + b',"details":' + orjson.dumps(details) + b"}\n\n")

    def flush(self) -> bytes:
        return self._release() if self._finish is None else b""

    def fail(self, exc: errors.GatewayError) -> bytes:
        """The tokens already made, then TGI's error event; nothing once the last event went."""
        if self._ended:
            return b""
        return self._release() + error_event(exc)

    def finish(self) -> bytes:
        return self._end()  # no `[DONE]` after /generate_stream (server.rs)


# ---- whole answers ----


def _choice_tokens(c: canonical.Choice) -> list[tuple[int, str, ev.TokenLogprob | None]]:
    ids = c.token_ids or []
    lps = c.logprobs or []
    texts = c.token_texts or []
    n = max(len(ids), len(lps))
    return [(ids[i] if i < len(ids) else UNKNOWN_ID,
             lps[i].token if i < len(lps) else (texts[i] if i < len(texts) else ""),
             lps[i] if i < len(lps) else None)
            for i in range(n)]


def _prefill(done: canonical.Completion, choice: int) -> list[dict[str, Any]]:
    """`PrefillToken`s from the worker's prompt logprobs. The first prompt token has no
    logprob, written `"logprob":null`; TGI gives its text, vLLM no text either."""
    return [{"id": tid, "text": lp.token if lp is not None else "",
             "logprob": f32(lp.logprob) if lp is not None else None}
            for tid, lp in done.prompt_tokens(choice)]


def _sequence(st: TgiState, done: canonical.Completion, c: canonical.Choice,
              usage: ev.Usage | None, special: frozenset[int] = _NONE) -> dict[str, Any]:
    """The fields Details and BestOfSequence share, in lib.rs order."""
    toks = _choice_tokens(c)
    count = len(toks) or (usage.completion_tokens if usage is not None else 0)
    tokens = [token(*t, special) for t in toks]
    if tokens and (tail := stop_tail("".join(t["text"] for t in tokens), c.finish)):
        tokens.append(stop_token(tail))  # kept as in with_stop (unless logprobs named it)
        count += 1
    out: dict[str, Any] = {
        "finish_reason": finish_reason(c.finish), "generated_tokens": count, "seed": st.seed,
        "prefill": _prefill(done, c.index) if st.prefill else [], "tokens": tokens}
    if st.top_n_tokens:
        out["top_tokens"] = [top_tokens(t[2], t[0], st.top_n_tokens, special, d["special"])
                             for t, d in zip(toks, tokens, strict=True)]
    return out


def _mean_logprob(c: canonical.Choice) -> float:
    lps = c.logprobs or []
    return sum(t.logprob or 0.0 for t in lps) / len(lps) if lps else -math.inf


def pick_best(choices: list[canonical.Choice]) -> tuple[canonical.Choice, list[canonical.Choice]]:
    """infer/mod.rs generate_best_of: the highest mean token logprob wins (the first on ties);
    the others keep their order."""
    best = 0
    for i, c in enumerate(choices):
        if _mean_logprob(c) > _mean_logprob(choices[best]):
            best = i
    return choices[best], choices[:best] + choices[best + 1:]


def generate_body(st: TgiState, done: canonical.Completion, best: canonical.Choice,
                  others: list[canonical.Choice],
                  special: frozenset[int] = _NONE) -> dict[str, Any]:
    """`GenerateResponse` (lib.rs): details only when asked, best_of_sequences only for
    best_of > 1, top_tokens only when non-empty (skip_serializing_if)."""
    out: dict[str, Any] = {"generated_text": with_stop(st.prefix + best.text, best.finish)}
    if not st.details:
        return out
    d = _sequence(st, done, best, done.usage if st.best_of == 1 else None, special)
    tops = d.pop("top_tokens", None)
    if st.best_of > 1:
        d["best_of_sequences"] = [
            {"generated_text": with_stop(st.prefix + c.text, c.finish),
             **_sequence(st, done, c, None, special)} for c in others]
    if tops:
        d["top_tokens"] = tops
    out["details"] = d
    return out


def render(st: TgiState, done: canonical.Completion,
           special: frozenset[int] = _NONE) -> base.Rendered:
    best, others = pick_best(done.choices) if st.best_of > 1 else (done.choices[0], [])
    body = generate_body(st, done, best, others, special)
    headers = {}
    if done.usage is not None:  # server.rs generate_internal: the returned sequence's counts
        generated = body["details"]["generated_tokens"] if "details" in body else \
            len(best.token_ids) if best.token_ids else done.usage.completion_tokens
        headers = {"x-prompt-tokens": str(done.usage.prompt_tokens),
                   "x-generated-tokens": str(generated)}
    return base.Rendered(200, orjson.dumps([body] if st.wrap else body), headers=headers)


# ---- errors: ErrorResponse {error, error_type} (lib.rs), statuses of From<InferError> ----


def error_parts(exc: errors.GatewayError) -> tuple[int, str, str]:
    """(status, error_type, message) as TGI's InferError renders the nearest kind of failure:
    validation 422 "Input validation error: ...", overloaded 429 "Model is overloaded",
    generation "Request failed during generation: ..." (with the gateway's 5xx status, as
    SPEC.md asks for a worker that is down). A refused key, a path no route takes: the same."""
    if isinstance(exc, errors.Overloaded) or exc.status == 429:  # also workers all overloaded
        return 429, "overloaded", "Model is overloaded"
    if isinstance(exc, errors.Unauthorized):
        return 401, "unauthorized", exc.message
    if isinstance(exc, errors.NoRoute):  # axum's 404/405 (and TGI's 401) have no body
        return exc.status, exc.kind, exc.message
    if isinstance(exc, errors.RequestError | errors.UpstreamRejected):
        status = 422 if exc.status in (400, 422) or isinstance(exc, errors.UpstreamRejected) \
            else exc.status
        return status, "validation", f"Input validation error: {exc.message}"
    status = exc.status if isinstance(exc, errors.UpstreamError) else 500
    return status, "generation", f"Request failed during generation: {exc.message}"


def error_json(exc: errors.GatewayError) -> tuple[int, bytes]:
    status, kind, message = error_parts(exc)
    return status, orjson.dumps({"error": message, "error_type": kind})


def error_event(exc: errors.GatewayError) -> bytes:
    """server.rs `From<InferError> for Event`: the ErrorResponse as one SSE event."""
    return framing.sse(error_json(exc)[1])


def render_error(exc: errors.GatewayError, in_stream: bool) -> base.Rendered:
    """TGI's error response; `in_stream`: /generate_stream, which runs every check inside the
    stream (the error is an event after HTTP 200). Rejections before TGI's handler (API key,
    body size or read timeout, no route for the path or method) keep their status and body."""
    if isinstance(exc, errors.MalformedBody):  # axum's Json extractor, before any stream
        return base.Rendered(exc.status, exc.message.encode(), "text/plain; charset=utf-8")
    status, body = error_json(exc)
    headers = base.retry_headers(exc)
    if in_stream and exc.status not in (401, 408, 413) and not isinstance(exc, errors.NoRoute):
        return base.Rendered(200, framing.sse(body), SSE_MEDIA_TYPE, {**SSE_HEADERS, **headers})
    return base.Rendered(status, body, headers=headers)
