"""OpenAI-compatible worker answers (vLLM, trtllm-serve, any OpenAI server) to canonical events.

One decoder per request (framing and failure order in decoder.FramedDecoder). Streaming: SSE
`data:` events; the answer is complete only at `data: [DONE]` (vLLM writes it even after an
error event). Non-streaming: the whole body is parsed at close.
"""

from __future__ import annotations

from typing import Any

import orjson

from adapters.backends import checked, decoder, error_text, text_slot
from schemas import errors
from schemas import events as ev

_FINISH: dict[str, ev.FinishReason] = {
    "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
    "content_filter": "content_filter", "abort": "abort",
    # trtllm-serve passes TensorRT-LLM's own reasons on (executor/result.py CompletionOutput
    # `finish_reason`: stop, length, timeout, cancelled): an answer cut short, not an end.
    "cancelled": "abort", "timeout": "abort",
}


def finish(choice: int, reason: str, stop_reason: Any) -> ev.Finish:
    """vLLM's (finish_reason, stop_reason) pair to the canonical reason; "stop" splits three ways."""
    if reason == "stop" or reason not in _FINISH:
        # vLLM protocol.py: stop_reason is the matched string, the stop token id, or null (EOS).
        matched = checked.matched(stop_reason)
        if isinstance(matched, str):
            return ev.Finish(choice, "stop_string", matched)
        if isinstance(matched, int):
            return ev.Finish(choice, "stop_token", matched)
        return ev.Finish(choice, "eos")
    return ev.Finish(choice, _FINISH[reason], checked.matched(stop_reason))


def usage(u: dict[str, Any]) -> ev.Usage:
    details = u.get("completion_tokens_details") or {}
    prompt_details = u.get("prompt_tokens_details") or {}
    return ev.Usage(
        checked.count(u.get("prompt_tokens"), "prompt_tokens"),
        checked.count(u.get("completion_tokens"), "completion_tokens"),
        checked.optional_count(details.get("reasoning_tokens"), "reasoning_tokens"),
        checked.optional_count(prompt_details.get("cached_tokens"), "cached_tokens"),
    )


def placeholder(token: str) -> int | None:
    """The id in vLLM's `token_id:N` token string (return_tokens_as_token_ids,
    serving_engine.py format_token_id_placeholder), else None."""
    if token.startswith("token_id:") and token[9:].isdigit():
        return checked.bounded(int(token[9:]), "a token id")
    return None


def _top(token: str, logprob: float, raw: Any = None) -> ev.TopLogprob:
    """An alternative; one named by id has no text here (a tokenizer may give it)."""
    tid = placeholder(checked.string(token, "a token"))
    logprob = checked.number(logprob, "a log prob")
    if tid is None:
        return ev.TopLogprob(token, logprob, checked.integers(raw, "a token's bytes"))
    return ev.TopLogprob("", logprob, None, tid)


def chat_logprobs(lp: Any, ids: list[int] | None) -> list[ev.TokenLogprob] | None:
    """ChatCompletionLogProbs. Named by id, the sampled token's `bytes` are still its text's
    (serving_chat.py _create_chat_logprobs), the alternatives' the placeholder's."""
    content = lp.get("content") if isinstance(lp, dict) else None
    if content is None:
        return None
    out = []
    for i, t in enumerate(content):
        tops = [_top(a["token"], a["logprob"], a.get("bytes"))
                for a in t.get("top_logprobs") or ()]
        tid = ids[i] if ids is not None and len(ids) == len(content) else None
        token = checked.string(t["token"], "a token")
        raw = checked.integers(t.get("bytes"), "a token's bytes")
        if (named := placeholder(token)) is not None:
            tid, token = named, bytes(raw or ()).decode("utf-8", "replace")
        value = checked.optional_number(t["logprob"], "a log prob")  # as before: null kept
        out.append(ev.TokenLogprob(token, value, raw, tid, tops))
    return out


def completion_logprobs(lp: Any, ids: list[int] | None,
                        text: str = "") -> list[ev.TokenLogprob] | None:
    """CompletionLogProbs. Tokens named by id carry no text (their `text_offset`s count the
    placeholders, serving_completion.py): one token alone in its chunk is the chunk's text."""
    if not isinstance(lp, dict) or lp.get("tokens") is None:
        return None
    tokens, values = lp["tokens"], lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    out = []
    for i, tok in enumerate(tokens):
        alt = tops[i] if i < len(tops) and tops[i] else {}
        tid = ids[i] if ids is not None and len(ids) == len(tokens) else None
        value = values[i] if i < len(values) else None  # null: an echoed prompt's first
        if (named := placeholder(checked.string(tok, "a token"))) is not None:
            tid, tok = named, text if len(tokens) == 1 else ""
        out.append(ev.TokenLogprob(tok, checked.optional_number(value, "a log prob"), None, tid,
                                   [_top(k, v) for k, v in alt.items()]))
    return out


def prompt_info(choice: int, ids: list[int] | None, plp: Any) -> ev.PromptInfo:
    """vLLM's completion-choice `prompt_token_ids` (return_token_ids) and `prompt_logprobs`:
    per position null (the first) or {"<id>": {"logprob", "rank", "decoded_token"}}, the prompt
    token among the top ones (protocol.py CompletionResponseChoice, Logprob)."""
    ids = checked.integers(ids, "prompt_token_ids")
    lps: list[ev.TokenLogprob | None] | None = None
    ranks: list[int | None] | None = None
    if isinstance(plp, list):
        lps, ranks = [], []
        for pos, entry in enumerate(plp):
            if not isinstance(entry, dict) or not entry:
                lps.append(None)
                ranks.append(None)
                continue
            key = str(ids[pos]) if ids is not None and pos < len(ids) and str(ids[pos]) in entry \
                else next(iter(entry))
            lp = entry[key]
            top = [ev.TopLogprob(str(a.get("decoded_token") or ""), float(a.get("logprob", 0.0)),
                                 None, checked.bounded(int(k), "a token id") if k.isdigit()
                                 else None)
                   for k, a in entry.items() if k != key and isinstance(a, dict)]
            lps.append(ev.TokenLogprob(str(lp.get("decoded_token") or ""),
                                       float(lp.get("logprob", 0.0)), None,
                                       checked.bounded(int(key), "a token id")
                                       if key.isdigit() else None, top))
            rank = lp.get("rank")
            ranks.append(rank if isinstance(rank, int) else None)
    return ev.PromptInfo(choice, ids, lps, ranks)


def arguments(value: Any) -> str:
    """A call's arguments, always the JSON text OpenAI's clients parse: TGI before v3.2.0 wrote
    them as a JSON object (lib.rs FunctionDefinition.arguments: Value, serialized as a string
    since "Fix tool call2", #3076)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def in_band_error(err: Any) -> errors.GatewayError:
    """An error event in a stream: vLLM's carries the status it would have answered (its
    int `code`, engine/serving.py create_error_response: 400 for a VLLMValidationError or
    ValueError, which add_request raises inside the stream, e.g. too many logprobs). A 4xx is
    the request's fault and is passed on as one; anything else is the worker failing."""
    message = error_text.event_message(err)
    code = err.get("code") if isinstance(err, dict) else None
    if type(code) is int and 400 <= code < 500:
        return errors.UpstreamRejected(message, status=code)
    return errors.UpstreamBroken(f"the worker failed: {message}")


class OpenAIDecoder(decoder.FramedDecoder):
    """Decodes chat or completions answers; `chat` picks `delta`/`message` versus `text`.

    A stream's choice ends at its `finish_reason` (OpenAI's chunk object: set on a choice's last
    chunk): what a worker sends for it afterwards is dropped, so every client protocol and the
    folded answer end the choice there. Each of the `choices` asked for must finish before
    `[DONE]`, else the stream is broken."""

    DONE = b"[DONE]"
    # An unterminated last event is still read (the blank line after `[DONE]` may be cut).
    FLUSH_TAIL = True

    def __init__(self, chat: bool, streaming: bool, wants_prompt: bool = False,
                 choices: int = 1):
        super().__init__("sse" if streaming else "whole")
        self._chat = chat
        self._wants_prompt = wants_prompt
        self._done = False
        self._choices = choices
        self._ended: set[Any] = set()  # the choices whose finish came
        # each streamed tool call's id and name, per (choice, index): given once (`_first`)
        self._ids: dict[tuple[int, int], Any] = {}
        self._names: dict[tuple[int, int], str] = {}
        self._calls: dict[int, dict[Any, int]] = {}  # per choice: the worker's call index -> ours
        # A stream's text chunks read by their text alone, once one proved the slot
        # (text_slot); not where a subclass's own `on_event` does more with each event (TGI's
        # Messages decoder trims stop strings), which the slot's events would go past.
        self.fast = streaming and type(self).on_event is OpenAIDecoder.on_event
        self._slot: text_slot.TextSlot | None = None
        self._payload = b""  # the event being parsed, while no slot is known
        self._unproved = 0  # plain text chunks that gave no slot

    def on_done(self) -> None:
        self._done = True

    def on_payload(self, payload: bytes, out: list[ev.Event]) -> bool:
        slot = self._slot
        if slot is None:
            self._payload = payload
            return False
        text = slot.text(payload)
        if text is None:
            return False
        if text and not (self._ended and slot.choice in self._ended):  # as `on_event` reads it
            out.append(ev.TextDelta(slot.choice, text))
        return True

    def on_end(self) -> list[ev.Event]:
        if self._framing == "whole":
            return []
        if not self._done:
            raise errors.UpstreamBroken("the worker's stream ended before `data: [DONE]`")
        if len(self._ended) < self._choices:
            raise errors.UpstreamBroken("the worker's stream ended without a finish reason")
        return []

    # Per chunk, a key of an object known to be a dict is read as `k in d and d[k]` rather
    # than `d.get(k)`: the same value without a method call (issue 17). A choice, which may be
    # any JSON value, is checked to be an object first: the compiled build then reads it
    # natively, where `.get` on an untyped value is a generic method call.

    def on_event(self, obj: dict[str, Any], out: list[ev.Event]) -> None:
        if "error" in obj and obj["error"]:  # vLLM's in-band error (wire-formats.md 3.5),
            raise in_band_error(obj["error"])  # then `[DONE]`
        # first: a chunk's continuous usage counts its own tokens
        if "usage" in obj and (u := obj["usage"]):
            out.append(usage(u))
        ended = self._ended
        before = len(out)
        for c in (obj["choices"] if "choices" in obj else None) or ():
            if not isinstance(c, dict):
                raise TypeError(f"a choice is {type(c).__name__}, not an object")
            i = c.get("index", 0)
            if type(i) is not int:  # a choice's index, as the compiled encoders read it (not
                # a bool, which the pure build would write back as one)
                raise TypeError(f"a choice's index is {type(i).__name__}, not an integer")
            if ended and i in ended:  # past its finish
                continue
            if self._chat:
                self._chat_choice(c, i, c.get("delta"), out)
            else:
                self._text_choice(c, i, out)
        if self.fast and self._slot is None and len(out) == before + 1:
            self._learn(obj, out[before])

    def _learn(self, obj: dict[str, Any], e: ev.Event) -> None:
        """The slot of a chunk whose one event is a text delta and nothing else: no usage, no
        other choice, no role, token ids, logprobs or finish (text_slot). Two plain chunks
        that give none (a worker's odd bytes) and the stream is read in full."""
        if type(e) is not ev.TextDelta or e.token_ids is not None or e.logprobs is not None \
                or obj.get("usage") or len(obj["choices"]) != 1:
            return
        c = obj["choices"][0]
        if c.get("finish_reason") or c.get("logprobs") or c.get("token_ids") is not None:
            return
        if self._chat:
            holder, field = c.get("delta"), "content"
            if type(holder) is not dict or len(holder) != 1:
                return
        elif c.get("prompt_token_ids") is not None or c.get("prompt_logprobs") is not None:
            return
        else:
            holder, field = c, "text"
        self._slot = text_slot.learn(self._payload, obj, holder, field, e.choice)
        if self._slot is None:
            self._unproved += 1
            self.fast = self._unproved < 2

    def _chat_choice(self, c: dict[str, Any], i: Any, delta: dict[str, Any] | None,
                     out: list[ev.Event]) -> None:
        m: dict[str, Any] = delta if delta is not None else c.get("message") or {}
        if extras := len(m) > 1 or "content" not in m:  # anything besides content here
            self._extras(m, i, out)
        ids = checked.integers(c["token_ids"], "token_ids") if "token_ids" in c else None
        lp = c["logprobs"] if "logprobs" in c else None
        lps = chat_logprobs(lp, ids) if lp else None
        text = checked.text(m.get("content"), "a choice's text")
        if text or ids or lps:
            out.append(ev.TextDelta(i, text, ids, lps))
        if extras and (calls := m.get("tool_calls")):
            if isinstance(calls, dict):  # TGI < 3.2 streams one call as an object (lib.rs
                calls = (calls,)  # ToolCallDelta.tool_calls: DeltaToolCall, a Vec from v3.2.0)
            for t in calls:
                fn = t.get("function") or {}
                index = self._call_index(i, t.get("index", 0)) if delta is not None \
                    else len(out)
                call_id = checked.optional_string(t.get("id"), "a tool call's id")
                name = checked.optional_string(fn.get("name"), "a tool call's name")
                if delta is not None and (call_id or name is not None):
                    call_id, name = self._first(i, index, call_id, name)
                out.append(ev.ToolCallDelta(i, index, call_id, name,
                                            arguments(fn.get("arguments"))))
        if "finish_reason" in c and (reason := c["finish_reason"]):
            self._end(c, i, reason, out)

    def _call_index(self, choice: int, index: Any) -> int:
        """A streamed call's index within its choice, in the order the calls came: vLLM up to
        0.14 numbers a named `tool_choice` call by its choice (serving_chat.py `index=i`), so
        with n > 1 a choice's only call can come as index 1."""
        calls = self._calls.setdefault(choice, {})
        if index not in calls:
            calls[index] = len(calls)
        return calls[index]

    def _first(self, choice: int, index: int, call_id: Any, name: str | None
               ) -> tuple[Any, str | None]:
        """A call's id and name once, on its first fragment, as OpenAI and vLLM stream them:
        TGI repeats the id on every fragment (chat.rs create_event_from_stream_token) and
        trtllm-serve a named `tool_choice`'s name (postprocess_handlers.py
        chat_stream_post_processor); a client adding the deltas up (openai-python
        accumulate_delta) would read either once per fragment. Another id is another call."""
        key = (choice, index)
        fresh = bool(call_id) and self._ids.get(key) != call_id
        if fresh:
            self._ids[key] = call_id
        elif call_id:
            call_id = None
        if name is not None:
            if not fresh and self._names.get(key) == name:
                name = None
            else:
                self._names[key] = name
        return call_id, name

    def _extras(self, m: dict[str, Any], i: int, out: list[ev.Event]) -> None:
        """Role and reasoning (vLLM < 0.12 `reasoning_content`, later `reasoning`)."""
        if m.get("role"):
            out.append(ev.Role(i, checked.string(m["role"], "a role")))
        reasoning = checked.text(m.get("reasoning_content") or m.get("reasoning"),
                                 "a choice's reasoning")
        if reasoning:
            out.append(ev.ReasoningDelta(i, reasoning))

    def _text_choice(self, c: dict[str, Any], i: Any, out: list[ev.Event]) -> None:
        if c.get("prompt_token_ids") is not None or c.get("prompt_logprobs") is not None:
            out.append(prompt_info(i, c.get("prompt_token_ids"), c.get("prompt_logprobs")))
        ids = checked.integers(c.get("token_ids"), "token_ids")
        lp = c.get("logprobs")
        text = checked.text(c.get("text"), "a choice's text")
        lps = completion_logprobs(lp, ids, text) if lp else None
        if text or ids or lps:
            out.append(ev.TextDelta(i, text, ids, lps))
        if "finish_reason" in c and (reason := c["finish_reason"]):
            self._end(c, i, reason, out)

    def _end(self, c: dict[str, Any], i: Any, reason: Any, out: list[ev.Event]) -> None:
        """The choice's finish (a non-empty `finish_reason`, tested by the caller: once a
        choice, where the test is every chunk)."""
        if reason == "error":
            raise errors.UpstreamBroken("the worker reported a generation error")
        self._ended.add(i)
        out.append(finish(i, checked.string(reason, "a finish_reason"), c.get("stop_reason")))

    def on_body(self, obj: Any, out: list[ev.Event]) -> None:
        if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
            raise errors.UpstreamBroken("the worker's answer has no `choices`")
        if self._chat and self._wants_prompt:  # the chat response's own (ChatCompletionResponse)
            self._prompt_of(obj, 0, out)
        for c in obj["choices"]:
            i = checked.integer(c.get("index", 0), "a choice's index")
            if self._wants_prompt and not self._chat:
                self._prompt_of(c, i, out)
            calls_before = len(out)
            if self._chat:
                self._chat_choice(c, i, None, out)
            else:
                self._text_choice(c, i, out)
            _renumber_calls(out, calls_before)
        if u := obj.get("usage"):
            out.append(usage(u))


    def _prompt_of(self, holder: dict[str, Any], choice: int, out: list[ev.Event]) -> None:
        """The prompt log probs a completions choice or a chat response carries; asked for
        and missing, a 4xx (SPEC.md: never blanks)."""
        if holder.get("prompt_logprobs") is None:
            raise errors.Unsupported("the model's worker returned no prompt logprobs "
                                     "(`prompt_logprobs`)", field="prompt_logprobs")
        if self._chat:  # a completions choice's are read with its other fields (_text_choice)
            out.append(prompt_info(choice, holder.get("prompt_token_ids"),
                                   holder.get("prompt_logprobs")))


def _renumber_calls(out: list[ev.Event], start: int) -> None:
    """Whole-message tool calls carry no index; number them in order within their choice."""
    n = 0
    for e in out[start:]:
        if isinstance(e, ev.ToolCallDelta):
            e.index = n
            n += 1
