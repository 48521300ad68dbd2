"""TGI answers to canonical events: /generate_stream events, /generate bodies, its chat API.

Sources, TGI router @ db931fcf (v3.3.7): `lib.rs` (StreamResponse, Token, StreamDetails,
GenerateResponse, Details, BestOfSequence, PrefillToken, FinishReason), `server.rs`
(`generate_stream_internal`: one `data: {...}\\n\\n` per token, `generated_text` and `details`
only on the last, no terminator, errors as `{"error","error_type"}` events under HTTP 200;
`From<InferError>` statuses), `infer/mod.rs` (InferError messages and `into_openai_event`:
chat stream errors are `{"error":{"message","http_status_code":422}}`). TGI keeps a matched stop
sequence in its text and does not say which one matched: the text tells (stops.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from adapters.backends import checked, decoder, error_text, openai_decode, stops
from schemas import errors
from schemas import events as ev

_FINISH: dict[str, ev.FinishReason] = {"length": "length", "eos_token": "eos",
                                       "stop_sequence": "stop_string"}
_VALIDATION = "Input validation error: "  # InferError::ValidationError's prefix


# InferError kinds that are the request's fault (server.rs: 422)
_CLIENT_KINDS = ("validation", "template_error", "missing_template_variable", "tool_error")


def classify(message: str, kind: str) -> errors.GatewayError:
    """An InferError by its `error_type`: the client's fault (validation, template, tools: TGI
    answers 422) is passed on, an overloaded worker may be replaced by another one (429),
    anything else is a failed generation."""
    if kind in _CLIENT_KINDS:
        text = message[len(_VALIDATION):] if message.startswith(_VALIDATION) else message
        return errors.UpstreamRejected(text, status=422)
    if kind == "overloaded":
        return errors.UpstreamUnavailable(message, status=429)
    return errors.UpstreamBroken(f"the worker failed: {message}")


# axum 0.7 extract/rejection.rs: the plain-text bodies of its JSON extractor's rejections.
AXUM_REJECTIONS = ("Failed to deserialize the JSON body", "Failed to parse the request body",
                   "Expected request with `Content-Type: application/json`")


def http_error(status: int, body: bytes) -> errors.GatewayError:
    """A TGI error before the first byte: `ErrorResponse` with server.rs's statuses (422
    validation, 424 generation, 429 overloaded, 500 incomplete), or axum's plain-text rejection
    of a malformed body."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("error"), str):
        message, kind = obj["error"], str(obj.get("error_type") or "")
    else:  # only axum's own rejections are TGI's words; other text (a proxy's page) is not
        text = body.decode("utf-8", "replace").strip()[:1000]
        message, kind = (text if text.startswith(AXUM_REJECTIONS) else ""), ""
    message = message or f"the worker answered HTTP {status}"
    if status >= 500:  # retried on another upstream, as for every worker kind
        return errors.UpstreamUnavailable(message, status=503 if status == 503 else 502)
    if status == 429 or kind == "overloaded":
        return errors.UpstreamUnavailable(message, status=429)
    if status == 424 or kind == "generation":  # the worker failed (SPEC.md: before the first
        # byte, asked of another upstream; a 502 where none does better), as an in-band
        # generation error before the first token is (gateway.pipeline `_first`)
        return errors.UpstreamUnavailable(f"the worker failed: {message}", status=502)
    # another 4xx is the request's fault whatever else its body says (an error_type TGI does
    # not write is no generation failure)
    return classify(message, kind) if kind in _CLIENT_KINDS \
        else errors.UpstreamRejected(message, status=status)


def _logprob(value: Any) -> float:
    # f32 NaN is written as null by serde_json (wire-formats.md 4.3).
    return float(value) if isinstance(value, int | float) else float("-inf")


def _token_logprob(tok: dict[str, Any], tops: list[dict[str, Any]] | None) -> ev.TokenLogprob:
    """The worker's token with its own text (`</s>` too) and `special` flag (lib.rs Token)."""
    alts = [ev.TopLogprob(str(t.get("text") or ""), _logprob(t.get("logprob")), None,
                          checked.optional_integer(t.get("id"), "a token's id"))
            for t in tops or ()]
    return ev.TokenLogprob(str(tok.get("text") or ""), _logprob(tok.get("logprob")), None,
                           checked.optional_integer(tok.get("id"), "a token's id"), alts,
                           bool(tok.get("special")))


def finish_events(trim: stops.StopTrimmer, choice: int, reason: str | None) -> list[ev.Event]:
    """The held text, cut of its stop sequence when that ended it, then the Finish. Without a
    reason (no details) the text decides between a stop sequence and a natural end."""
    matched = trim.matched()
    kind: ev.FinishReason = "stop_string" if matched is not None else "eos"
    kind = _FINISH.get(reason or "", kind)
    if kind == "length" and matched is not None and trim.cuts:  # as vLLM (stops.py)
        kind = "stop_string"
    cut = matched if kind == "stop_string" else None
    out: list[ev.Event] = []
    out.extend(trim.release(cut))
    out.append(ev.Finish(choice, kind, cut))
    return out


class TgiStreamDecoder(decoder.FramedDecoder):
    """/generate_stream: one token per event; the last carries `details` (always asked for)."""

    def __init__(self, stop: list[str], keep_stop: bool, logprobs: bool,
                 echo: str | None = None):
        super().__init__("sse")
        self._trim = stops.StopTrimmer(stop, keep_stop)
        self._logprobs = logprobs
        self._echo = echo
        self._done = False

    def on_end(self) -> list[ev.Event]:
        if not self._done:
            raise errors.UpstreamBroken("the worker's stream ended before its last token")
        return []

    def on_event(self, obj: dict[str, Any], out: list[ev.Event]) -> None:
        if "error" in obj:
            raise classify(str(obj["error"]), str(obj.get("error_type") or ""))
        tok = obj.get("token")
        if not isinstance(tok, dict) or self._done:
            raise errors.UpstreamBroken("the worker sent an event that is not a token")
        if self._echo is not None:
            out.append(ev.TextDelta(0, self._echo))
            self._echo = None
        tid = checked.token_id(tok.get("id"))
        # A special token's text (`</s>`) is not in generated_text (flash_causal_lm.py decodes
        # it with skip_special_tokens): the delta leaves it out, its logprob keeps it.
        text = "" if tok.get("special") else str(tok.get("text") or "")
        lps = [_token_logprob(tok, obj.get("top_tokens"))] if self._logprobs else None
        out.extend(self._trim.push(ev.TextDelta(0, text, None if tid is None else [tid], lps)))
        if obj.get("generated_text") is not None:  # the last event (server.rs End)
            self._done = True
            details = obj.get("details") or {}
            out.extend(finish_events(self._trim, 0, checked.optional_string(
                details.get("finish_reason"), "a finish_reason")))
            if isinstance(details.get("input_length"), int):
                out.append(ev.Usage(checked.count(details["input_length"], "input_length"),
                                    checked.count(details["generated_tokens"],
                                                  "generated_tokens")))


class TgiWholeDecoder(decoder.FramedDecoder):
    """/generate: `generated_text` with `details` (tokens, prefill, best_of_sequences)."""

    def __init__(self, stop: list[str], keep_stop: bool, logprobs: bool, echo: str | None,
                 n: int):
        super().__init__("whole")
        self._stop = stop
        self._keep = keep_stop
        self._logprobs = logprobs
        self._echo = echo
        self._n = n

    def on_event(self, obj: dict[str, Any], out: list[ev.Event]) -> None:
        if not isinstance(obj.get("generated_text"), str):
            raise errors.UpstreamBroken("the worker's answer has no `generated_text`")
        details = obj.get("details") or {}
        prefill = details.get("prefill") or []
        if prefill:  # PrefillToken: the first prompt token has a text but no logprob (NaN,
            # written null: flash_causal_lm.py generate_token, `request_prefill_logprobs`):
            # none, as vLLM's first prompt logprob is (not -inf, which LMI's json.dumps-shaped
            # lines would write as -Infinity, no JSON)
            ids = [checked.integer(t.get("id"), "a prompt token's id") for t in prefill]
            out.append(ev.PromptInfo(0, ids, [
                ev.TokenLogprob(str(t.get("text") or ""), None if (lp := t.get("logprob")) is None
                                else _logprob(lp), None, tid)
                for t, tid in zip(prefill, ids, strict=True)]))
        seqs = [(obj["generated_text"], details)]
        seqs += [(s.get("generated_text") or "", s)
                 for s in details.get("best_of_sequences") or []][:max(self._n, 1) - 1]
        for i, (text, d) in enumerate(seqs):
            out.extend(self._sequence(i, text, d))
        if prefill:
            out.append(ev.Usage(len(prefill), checked.count(sum(
                checked.count(d.get("generated_tokens"), "generated_tokens") for _, d in seqs),
                "generated_tokens")))

    def _sequence(self, i: int, text: str, d: dict[str, Any]) -> list[ev.Event]:
        tokens = d.get("tokens") or []
        tops = d.get("top_tokens") or []
        ids = [checked.integer(t.get("id"), "a token's id") for t in tokens] or None
        lps = [_token_logprob(t, tops[k] if k < len(tops) else None)
               for k, t in enumerate(tokens)] if self._logprobs else None
        out: list[ev.Event] = [ev.TextDelta(i, self._echo)] if self._echo is not None else []
        trim = stops.StopTrimmer(self._stop, self._keep)
        out.extend(trim.push(ev.TextDelta(i, text, ids, lps)))
        out.extend(finish_events(trim, i, checked.optional_string(d.get("finish_reason"),
                                                                 "a finish_reason")))
        return out


class TgiChatDecoder(openai_decode.OpenAIDecoder):
    """TGI's Messages API is OpenAI's, but for its stop handling (`stop_sequence` finish reason,
    the string kept in the text), a role in every delta, and errors that are always 422."""

    def __init__(self, streaming: bool, stop: list[str], keep_stop: bool, skip: str = ""):
        super().__init__(True, streaming)
        self._trim = stops.StopTrimmer(stop, keep_stop)
        # A continuation's answer repeats the whitespace TGI trimmed off the text so far
        # (tgi_messages.trimmed): dropped from its start, as far as it repeats it.
        self._skip = skip
        self._roles: set[int] = set()
        self._called: set[int] = set()  # choices that made a tool call
        self._legacy: dict[int, list[str]] = {}  # a pre-3.2 call's raw text, per choice

    def on_event(self, obj: dict[str, Any], out: list[ev.Event]) -> None:
        if "error" in obj:  # OpenaiErrorEvent (infer/mod.rs into_openai_event)
            err = obj["error"]
            message = error_text.event_message(err)  # never a repr of the worker's body
            raise classify(message, "validation" if message.startswith(_VALIDATION) else
                           "overloaded" if message == "Model is overloaded" else "generation")
        mine: list[ev.Event] = []
        super().on_event(obj, mine)
        out.extend(self._post(mine))

    def on_body(self, obj: Any, out: list[ev.Event]) -> None:
        mine: list[ev.Event] = []
        super().on_body(obj, mine)
        out.extend(self._post(mine))

    def _end(self, c: dict[str, Any], i: Any, reason: Any, out: list[ev.Event]) -> None:
        if reason == "stop_sequence":  # FinishReason::format(true) keeps it
            self._ended.add(i)
            out.append(ev.Finish(i, "stop_string"))
        else:
            super()._end(c, i, reason, out)

    def _post(self, events: list[ev.Event]) -> list[ev.Event]:
        """One role per choice; text through the stop trimmer; the Finish names the match.
        TGI ends a grammar-made tool call with `stop` (chat.rs); it is `tool_calls` here, as
        OpenAI and vLLM say when the answer is a call."""
        out: list[ev.Event] = []
        for e in events:
            if isinstance(e, ev.Role):
                if e.choice not in self._roles:
                    self._roles.add(e.choice)
                    out.append(e)
            elif isinstance(e, ev.TextDelta):
                if self._skip and not (e := self._skipped(e)).text:
                    continue
                out.extend(self._trim.push(e))
            elif isinstance(e, ev.Finish):
                out.extend(self._legacy_call(e.choice))
                if e.reason == "stop_string":
                    out.extend(finish_events(self._trim, e.choice, "stop_sequence"))
                    continue
                out.extend(self._trim.release())
                if e.reason == "eos" and e.choice in self._called:
                    e = ev.Finish(e.choice, "tool_calls")
                out.append(e)
            elif isinstance(e, ev.ToolCallDelta):
                if e.choice in self._legacy or (e.name is None and e.choice not in self._called):
                    self._legacy.setdefault(e.choice, []).append(e.arguments)
                    continue
                self._called.add(e.choice)
                out.append(e)
            else:
                out.append(e)
        return out

    def _skipped(self, e: ev.TextDelta) -> ev.TextDelta:
        """`e` less the start that repeats `_skip`; skipping ends at the first other text."""
        text, skip = e.text, self._skip
        k = 0
        while k < len(text) and k < len(skip) and text[k] == skip[k]:
            k += 1
        self._skip = skip[k:] if k == len(text) else ""
        return dataclasses.replace(e, text=text[k:]) if k else e

    def _legacy_call(self, choice: int) -> list[ev.Event]:
        """A call streamed as TGI did before v3.2.0 (server.rs chat_completions @ v3.1.0):
        no name, and as arguments the grammar's raw output, `{"function": {"_name": N, ...}}`.
        Buffered to its end, it becomes one call named N with the other keys as arguments."""
        parts = self._legacy.pop(choice, None)
        if parts is None:
            return []
        try:
            fn = orjson.loads("".join(parts))["function"]
            name = fn.pop("_name")
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise errors.UpstreamBroken("the worker's tool call is not the JSON its grammar "
                                        "makes") from None
        self._called.add(choice)
        return [ev.ToolCallDelta(choice, 0, "0", str(name), orjson.dumps(fn).decode())]
