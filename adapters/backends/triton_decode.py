"""Triton generate / generate_stream answers to canonical events, the finish reason inferred.

Streaming (server src/http_server.cc `FinalizeResponse`, `AddErrorJson`): one `data: {...}\\n\\n`
per model response, no finish reason and no terminator: the stream just ends. A failure after
the first response is `data: {"error": "..."}` under HTTP 200 (docs/protocol/
extension_generate.md). Each response's `text_output` is the text of its new tokens (the
postprocessing model decodes the tokens of each response), `num_output_tokens` their count and
`num_input_tokens` the prompt's (tensorrt_llm/1/model.py `convert_response`, asked for with
`return_num_*_tokens`). Non-streaming: one JSON object with the whole text.

A finish reason is inferred (SPEC.md): the token count against the limit sent, then a matched
stop word (which TensorRT-LLM keeps in the text and which is cut off here), else a natural end.
A stream whose counted tokens reach the limit has ended whatever comes after, so its finish
goes out with its last response, not when the connection ends: a TGI client's last event
carries the last token (not an empty one after it), every client's finish comes with its text.
"""

from __future__ import annotations

from typing import Any

import orjson

from adapters.backends import checked, decoder, error_text, stops
from schemas import errors
from schemas import events as ev


def error_message(body: bytes) -> str:
    """The message of `{"error": "..."}`, whole or as the SSE event a stream's first response
    writes; empty for a body that is not JSON (a proxy's HTML page is no message for a client)."""
    text = body.strip()
    if text.startswith(b"data:"):
        text = text[5:].split(b"\n", 1)[0].strip()
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return ""
    if isinstance(obj, dict) and "error" in obj:
        obj = obj["error"]
    return error_text.text(obj)[:1000]  # never a repr of the worker's body


def _logprobs(obj: dict[str, Any]) -> int | None:
    """How many `output_log_probs` values a response holds (one is written as a scalar,
    http_server.cc ExactMappingOutput); None without them."""
    lps = obj.get("output_log_probs")
    if isinstance(lps, list):
        return len(lps)
    return 1 if isinstance(lps, float | int) else None


class TritonDecoder(decoder.FramedDecoder):
    """One request's answer; `limit` is the `max_tokens` sent, `echo` the prompt to put first."""

    NOT_OBJECT = "the worker's response is not a JSON object"

    def __init__(self, streaming: bool, limit: int, stop: list[str], keep_stop: bool,
                 echo: str | None = None):
        super().__init__("sse" if streaming else "whole")
        self._streaming = streaming
        self._limit = limit
        self._echo = echo
        self._stops = stops.StopTrimmer(stop, keep_stop)
        self._responses = 0
        self._generated = 0
        self._counted = True  # every response said how many tokens it held
        self._exact = True  # ... in `num_output_tokens`
        self._prompt: int | None = None
        self._logprobs = 0  # `output_log_probs` values in the last response
        self._finished = False  # the limit was reached: the finish is out

    def on_end(self) -> list[ev.Event]:
        if not self._responses:
            raise errors.UpstreamBroken("the worker's answer held no response")
        return [] if self._finished else self._end()

    def on_event(self, obj: dict[str, Any], out: list[ev.Event]) -> None:
        if "error" in obj:
            raise errors.UpstreamBroken(f"the worker failed: {obj['error']}")
        text = obj.get("text_output")
        if isinstance(text, list):  # beams or sequences: the first is the best
            text = text[0] if text else ""
        if not isinstance(text, str):
            raise errors.UpstreamBroken("the worker's response has no `text_output`")
        self._responses += 1
        if self._echo is not None:
            out.append(ev.TextDelta(0, self._echo))
            self._echo = None
        self._tally(obj)
        if self._finished:  # past the limit (an empty final response): nothing more to say
            return
        if text:
            out.extend(self._stops.push(ev.TextDelta(0, text)))
        if self._streaming and self._counted and self._generated >= self._limit:
            self._finished = True
            out.extend(self._end())

    def _count(self, obj: dict[str, Any]) -> int | None:
        """Tokens in this response: `num_output_tokens`, else by its `output_log_probs`. An
        older ensemble streams those of the whole sequence so far (a recorded stream:
        0.0, [0.0,0.0], [0.0,0.0,0.0], ... beside one word each), so a stream's response
        counts what it holds beyond the one before; not more, its own length."""
        n = obj.get("num_output_tokens")
        if isinstance(n, int):
            return n
        lps = _logprobs(obj)
        if lps is None or not self._streaming:
            return lps
        grown, self._logprobs = lps - self._logprobs, lps
        return grown if grown > 0 else lps

    def _tally(self, obj: dict[str, Any]) -> None:
        n = self._count(obj)
        if n is None:
            self._counted = False
        else:
            self._generated = checked.count(self._generated + n, "num_output_tokens")
        self._exact = self._exact and isinstance(obj.get("num_output_tokens"), int)
        prompt = obj.get("num_input_tokens")
        if self._prompt is None and isinstance(prompt, int):
            self._prompt = checked.count(prompt, "num_input_tokens")

    def _end(self) -> list[ev.Event]:
        """The held text, the inferred Finish, and the usage when the worker counted."""
        matched = self._stops.matched()
        at_limit = self._counted and self._generated >= self._limit
        if matched is not None and (self._stops.cuts or not at_limit):  # stops.py: which wins
            finish = ev.Finish(0, "stop_string", matched)
        elif at_limit:
            finish = ev.Finish(0, "length")
        else:
            finish = ev.Finish(0, "eos")
        out: list[ev.Event] = []
        out.extend(self._stops.release(matched if finish.reason == "stop_string" else None))
        out.append(finish)
        if self._exact and self._prompt is not None:
            out.append(ev.Usage(self._prompt, self._generated))
        return out
