"""LMI streams: rolling-batch token lines, dynamic-batch `outputs` lines, chat.completion.chunk
lines, SageMaker completion SSE.

Byte sources: DJL Serving v0.36.0 `output_formatter.py` — `_jsonlines_output_formatter` (one
`{"token": {...}}` line per token, the last adding generated_text and details),
`_jsonlines_chat_output_formatter` (role on the first delta, after its content; finish_reason
on the last token's chunk; logprobs as a one-element list) and `sse_response_formatter`
(`"data: " + line + "\\n"`, so `data: {...}\\n\\n`, no terminator) — with Python `json.dumps`
separators; seed 003 for the mid-stream error line; seed 002 (vLLM's compact chunks, `data: `
events, `data: [DONE]`) for `prompt` streams. DJL knows which token is last when it writes it;
here the Finish follows the token, so the newest line is held until the end of the upstream
read it came in (`flush`): vLLM sends the last token with its finish_reason, so it is merged.
A Finish in a read of its own ends with DJL's stand-in token (id -1, empty text) instead.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, assert_never

import orjson

from adapters import base, framing
from adapters.frontends import lmi_json
from adapters.frontends import lmi_render as render
from adapters.frontends.lmi_params import LmiState
from adapters.frontends.openai_encode import uncovered
from schemas import canonical, errors
from schemas import events as ev

_dumps = lmi_json.dumps
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class _Framed:
    """JSON lines (`application/jsonlines`) or DJL's SSE (`data: ` + line + blank line)."""

    headers = _NO_HEADERS

    def __init__(self, sse: bool):
        self.media_type = "text/event-stream" if sse else "application/jsonlines"
        self._pre, self._post = (b"data: ", b"\n\n") if sse else (b"", b"\n")

    def _line(self, body: bytes) -> bytes:
        return self._pre + body + self._post


class RollingStreamEncoder(_Framed):
    """Seed 003 rolling-batch stream (one choice: n > 1 is refused when streaming)."""

    def __init__(self, st: LmiState):
        super().__init__(st.sse)
        self._st = st
        self._key = b'"logprob": ' if st.tgi_compat else b'"log_prob": '
        self._held: bytes | None = None  # the newest line, without its closing brace
        self._text: list[str] = [st.prefix(0)]
        self._tokens = 0
        self._tops: list[list[dict[str, Any]]] = []
        self._ended = False

    def encode(self, e: ev.Event) -> bytes:
        if isinstance(e, ev.TextDelta):
            return self._delta(e) if e.choice == 0 and not self._ended else b""
        if isinstance(e, ev.Finish):
            return self._end(e) if e.choice == 0 else b""
        if isinstance(e, ev.Role | ev.ReasoningDelta | ev.ToolCallDelta | ev.Usage | ev.PromptInfo):
            return b""
        assert_never(e)

    def _head(self, tid: int, text: str, lp: ev.TokenLogprob | None) -> bytes:
        return b'{"token": {"id": %d, "text": %s, %s%s}' % (
            tid, orjson.dumps(text), self._key, lmi_json.number(lp.logprob if lp else None))

    def _delta(self, e: ev.TextDelta) -> bytes:
        """A token line per token, its text the worker's decoding of that token where the
        worker gave one (DJL: each Token's text is vLLM's `decoded_token`), as the whole
        answer's `details.tokens` has it: a delta can be shifted off the token boundaries
        (vLLM holds text back while a stop string may be matching) or empty (an EOS token).
        `generated_text` is the deltas' text."""
        out = self._release() if self._held is not None else b""
        self._text.append(e.text)
        ids, lps = e.token_ids, e.logprobs
        # one token: one id, or (the usual worker) no ids and no log probs
        if not self._st.top_n_tokens and (len(ids) == 1 if ids else not lps):
            self._tokens += 1
            lp = lps[0] if lps else None
            text = lp.token if lp is not None and lp.token else e.text
            self._held = b'{"token": {"id": %d, "text": %b, %b%b}' % (
                ids[0] if ids else render.UNKNOWN_ID, orjson.dumps(text),
                self._key, lmi_json.number(lp.logprob if lp is not None else None))
            return out
        toks = [(tid, lp.token if lp is not None and lp.token else text, lp)
                for tid, text, lp in e.per_token(render.UNKNOWN_ID)]
        self._tokens += len(toks)
        if self._st.top_n_tokens:
            self._tops += [render.top_tokens(t[2], t[0], self._st.tgi_compat) for t in toks]
        for t in toks[:-1]:
            out += self._line(self._head(*t) + b"}")
        self._held = self._head(*toks[-1])
        return out

    def _release(self) -> bytes:
        if self._held is None:
            return b""
        out, self._held = self._line(self._held + b"}"), None
        return out

    def _end(self, f: ev.Finish | None) -> bytes:
        """The last line: the last token (or DJL's stand-in), generated_text, details."""
        if self._ended:
            return b""
        self._ended = True
        head = self._held if self._held is not None else self._head(render.UNKNOWN_ID, "", None)
        self._held = None
        out = head + b', "generated_text": ' + orjson.dumps("".join(self._text))
        if self._st.details:  # get_details_dict(include_tokens=False)
            details: dict[str, Any] = {"finish_reason": render.finish_name(f),
                                       "generated_tokens": self._tokens,
                                       "inputs": self._st.prompts[0]}
            if self._st.top_n_tokens:
                details["top_tokens"] = self._tops
            out += b', "details": ' + _dumps(details)
        return self._line(out + b"}")

    def flush(self) -> bytes:
        return self._release()

    def fail(self, exc: errors.GatewayError) -> bytes:
        """Seed 003 "When using streaming": the error token line ends the stream."""
        if self._ended:
            return b""
        tok = (b'{"id": -1, "text": "", "logprob": -1, "special": true}' if self._st.tgi_compat
               else b'{"id": -1, "text": "", "log_prob": -1, "special_token": true}')
        return self._release() + self._line(
            b'{"token": ' + tok + b', "generated_text": "", "details": {"finish_reason": '
            b'"error", "generated_tokens": null, "inputs": null}}')

    def finish(self) -> bytes:
        return self._end(None)


class DynamicStreamEncoder(_Framed):
    """Seed 003 dynamic-batch stream: `{"outputs": [...]}` lines, one text per input.

    DJL's generic streaming (streaming_utils.py `_hf_model_stream_generator`, outputs.py
    `_default_stream_output_formatter`: `json.dumps({"outputs": token_texts}) + "\\n"`) yields,
    at each decoding step, the new token's text of every input of the batch. The worker streams
    each input's tokens on their own, so a line is written once every input still generating
    has its next text; an input that has finished gives "" from then on."""

    holds_back = False  # `flush` is always b"" (base.StreamEncoder)

    def __init__(self, st: LmiState):
        super().__init__(st.sse)
        # return_full_text: each input's text starts with its prompt, as in the whole answer
        self._pending: list[deque[str]] = [deque([p] if st.full_text else ())
                                           for p in st.prompts]
        self._open = [True] * len(st.prompts)

    def encode(self, e: ev.Event) -> bytes:
        if isinstance(e, ev.TextDelta):
            if e.text and e.choice < len(self._pending):
                self._pending[e.choice].append(e.text)
            return self._due()
        if isinstance(e, ev.Finish):
            if e.choice < len(self._open):
                self._open[e.choice] = False
            return self._due()
        if isinstance(e, ev.Role | ev.ReasoningDelta | ev.ToolCallDelta | ev.Usage | ev.PromptInfo):
            return b""
        assert_never(e)

    def _step(self) -> bytes:
        texts = [q.popleft() if q else "" for q in self._pending]
        return self._line(json.dumps({"outputs": texts}).encode())

    def _due(self, end: bool = False) -> bytes:
        """The steps every open input has a text for (at the end: every step left)."""
        out = b""
        while any(self._pending) and (end or all(
                q or not live for q, live in zip(self._pending, self._open))):
            out += self._step()
        return out

    def flush(self) -> bytes:
        return b""

    def fail(self, exc: errors.GatewayError) -> bytes:
        """Seed 003 dynamic-batch error body (`Output.error`), as the last line."""
        return self._due(end=True) + self._line(json.dumps(
            {"code": render.error_status(exc), "message": "invoke handler failure",
             "error": exc.message}).encode())

    def finish(self) -> bytes:
        return self._due(end=True)


class ChatStreamEncoder(_Framed):
    """Seed 000 chat.completion.chunk lines; the newest chunk of each choice is held."""

    def __init__(self, req: canonical.InferenceRequest, meta: base.ResponseMeta, sse: bool):
        super().__init__(sse)
        self._head = (b'{"id": ' + orjson.dumps(render.CHAT_ID + meta.id)
                      + b', "object": "chat.completion.chunk", "created": '
                      + str(meta.created).encode() + b', "choices": [')
        self._logprobs = req.logprobs
        self._held: dict[int, dict[str, Any]] = {}
        self._started: set[int] = set()
        self._finished: set[int] = set()
        self._meta = meta

    def encode(self, e: ev.Event) -> bytes:
        if isinstance(e, ev.TextDelta):
            lp = None
            if self._logprobs and e.logprobs is not None:
                lp = [{"content": [render.chat_logprob(t) for t in e.logprobs]}]
            return self._delta(e.choice, {"content": e.text}, lp)
        if isinstance(e, ev.ReasoningDelta):
            return self._delta(e.choice, {"reasoning_content": e.text}, None)
        if isinstance(e, ev.ToolCallDelta):
            call = _tool_call(e, self._meta.delta_call_id(e))
            return self._delta(e.choice, {"tool_calls": [call]}, None)
        if isinstance(e, ev.Finish):
            return self._finish(e)
        if isinstance(e, ev.Role | ev.Usage | ev.PromptInfo):
            return b""
        assert_never(e)

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        delta = choice["delta"]
        if len(delta) == 1 and "content" in delta and choice["logprobs"] is None:
            body = b'{"index": %d, "delta": {"content": %s}, "logprobs": null, ' \
                   b'"finish_reason": %s}' % (choice["index"], orjson.dumps(delta["content"]),
                                              _dumps(choice["finish_reason"]))
        else:
            body = _dumps(choice)
        return self._line(self._head + body + b"]}")

    def _delta(self, i: int, delta: dict[str, Any], lp: Any) -> bytes:
        if i in self._finished:
            return b""
        out = self._release(i)
        if i not in self._started:  # DJL: `if first_token: delta["role"] = "assistant"`
            self._started.add(i)
            delta["role"] = "assistant"
        self._held[i] = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": None}
        return out

    def _release(self, i: int) -> bytes:
        held = self._held.pop(i, None)
        return self._chunk(held) if held is not None else b""

    def _finish(self, e: ev.Finish) -> bytes:
        if e.choice in self._finished:
            return b""
        choice = self._held.pop(e.choice, None)
        if choice is None:  # DJL's stand-in token: empty content
            self._delta(e.choice, {"content": ""}, None)
            choice = self._held.pop(e.choice)
        self._finished.add(e.choice)
        choice["finish_reason"] = render.finish_name(e)
        return self._chunk(choice)

    def flush(self) -> bytes:
        held = self._held
        if len(held) == 1:  # one choice, the usual: no sort, no join
            return self._chunk(held.popitem()[1])
        return b"".join([self._release(i) for i in sorted(held)])

    def fail(self, exc: errors.GatewayError) -> bytes:
        """Seed 003's error semantics in chat form: what DJL's chat formatter writes for the
        error token (`Token(-1, "")` with finish_reason "error") on each open choice."""
        out = self.flush()
        still_open = sorted(self._started - self._finished)
        if self._started and not still_open:
            return out  # every choice had its last chunk; nothing is left to end
        for i in still_open or [0]:
            self._delta(i, {"content": ""}, None)
            choice = self._held.pop(i)
            choice["finish_reason"] = "error"
            out += self._chunk(choice)
        self._finished |= self._started | {0}
        return out

    def finish(self) -> bytes:
        return self.flush()


def _tool_call(e: ev.ToolCallDelta, call_id: str | None) -> dict[str, Any]:
    """vLLM DeltaToolCall.model_dump(exclude_none=True), as DJL writes it: id, type, index,
    function."""
    out: dict[str, Any] = {}
    if call_id is not None:
        out["id"] = call_id
        out["type"] = "function"
    out["index"] = e.index
    fn: dict[str, Any] = {}
    if e.name is not None:
        fn["name"] = e.name
    fn["arguments"] = e.arguments
    out["function"] = fn
    return out


class CompletionStreamEncoder:
    """Seed 002 text completion stream: vLLM's compact chunks with `stop_reason` and
    `"usage":null` on each, `data: ` events, `data: [DONE]` at the end."""

    media_type = "text/event-stream; charset=utf-8"  # vLLM (Starlette adds the charset)
    headers = _NO_HEADERS

    def __init__(self, req: canonical.InferenceRequest, meta: base.ResponseMeta):
        self._head = (b'data: {"id":' + orjson.dumps(render.COMPLETION_ID + meta.id)
                      + b',"object":"text_completion","created":' + str(meta.created).encode()
                      + b',"model":' + orjson.dumps(render.SAGEMAKER_MODEL) + b',"choices":[')
        self._req = req
        self._held: dict[int, dict[str, Any]] = {}
        self._offsets: dict[int, int] = {}
        self._usage: ev.Usage | None = None
        self._generated = 0

    def encode(self, e: ev.Event) -> bytes:
        if isinstance(e, ev.TextDelta):
            return self._text(e)
        if isinstance(e, ev.Finish):
            c = self._held.pop(e.choice, None) or self._choice(e.choice, "", None, None)
            c["finish_reason"] = render.VLLM_FINISH[e.reason]
            c["stop_reason"] = e.matched
            return self._chunk(c)
        if isinstance(e, ev.Usage):
            self._usage = e
            return b""
        if isinstance(e, ev.Role | ev.ReasoningDelta | ev.ToolCallDelta | ev.PromptInfo):
            return b""
        assert_never(e)

    def _choice(self, i: int, text: str, lp: Any, ids: list[int] | None) -> dict[str, Any]:
        c: dict[str, Any] = {"index": i, "text": text, "logprobs": lp, "finish_reason": None,
                             "stop_reason": None}
        if self._req.token_ids:
            c["token_ids"] = ids
        return c

    def _text(self, e: ev.TextDelta) -> bytes:
        out = self.flush()
        self._generated += len(e.token_ids) if e.token_ids is not None else 1
        lp = None
        if self._req.logprobs and e.logprobs is not None:
            offset = self._offsets.get(e.choice, 0)
            start = offset + uncovered(e.text, e.logprobs) if self._req.echo else offset
            lp = render.completion_logprobs(e.logprobs, start)
            self._offsets[e.choice] = offset + len(e.text)
        self._held[e.choice] = self._choice(e.choice, e.text, lp, e.token_ids)
        return out

    def _chunk(self, c: dict[str, Any]) -> bytes:
        return self._head + orjson.dumps(c) + b'],"usage":null}\n\n'

    def flush(self) -> bytes:
        return b"".join([self._chunk(self._held.pop(i)) for i in sorted(self._held)])

    def fail(self, exc: errors.GatewayError) -> bytes:
        """vLLM's in-band error (serving_engine.py create_streaming_error_response, json.dumps
        with its spaces), then `data: [DONE]` as vLLM always writes it."""
        err = {"error": {"message": exc.message, "type": _vllm_error_type(exc.status),
                         "param": None, "code": exc.status}}
        return self.flush() + framing.sse(json.dumps(err).encode()) + framing.SSE_DONE

    def finish(self) -> bytes:
        out = self.flush()
        if self._req.include_usage:  # the usage chunk, seed 002's key order
            u = self._usage or ev.Usage(0, self._generated)
            out += self._head + b'],"usage":' + orjson.dumps(
                {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                 "total_tokens": u.total_tokens}) + b"}\n\n"
        return out + framing.SSE_DONE


def _vllm_error_type(status: int) -> str:
    """vLLM ErrorInfo.type names by status (wire-formats.md 3.5)."""
    return {400: "BadRequestError", 404: "NotFoundError", 422: "UnprocessableEntityError",
            503: "ServiceUnavailableError"}.get(status, "InternalServerError")
