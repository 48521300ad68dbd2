"""Stop strings that a worker keeps in its text (TGI, Triton), cut off whatever the chunking.

OpenAI and vLLM never return the matched stop string (SPEC.md, "Stop strings"), but TGI's
StopSequenceCriteria (server/text_generation_server/utils/tokens.py: the regex `{stop}$` on the
output so far) and TensorRT-LLM's stop words end generation *after* the match and keep it
(tensorrtllm_backend docs/llama.md: `"stop_words": ["focuses", "learn"]` gives a text ending in
"learn"). So a delta whose tail could begin a stop string is held until a later one shows it
does not; at the end the matched string is cut from the held deltas. Token ids and logprobs
stay with their delta, as vLLM reports the ids of the tokens whose text it dropped.
`keep=True` (a client that asked for `include_stop_str_in_output`, as TGI's own front end
does) passes every delta through at once and only says which string matched.
A stop string that the last token allowed completes is a stop for a client that never sees
stop strings (vLLM: v1/engine/output_processor.py `process_outputs` makes the finish STOP when
the detokenizer finds one, whatever the scheduler capped) but the worker's `length` for one
that keeps them (TGI's StoppingCriteria checks the length first).
"""

from __future__ import annotations

from schemas import canonical
from schemas import events as ev


def kept(req: canonical.InferenceRequest) -> bool:
    """Whether the client keeps a matched stop string in its text (TGI's clients; LMI's
    `include_stop_str_in_output`)."""
    return req.sampling.keep_stop or req.extra.get("include_stop_str_in_output") is True


class StopTrimmer:
    """Holds back the text that may be a stop string; one per choice."""

    __slots__ = ("_held", "_held_text", "_keep", "_longest", "_stops", "_tail")

    def __init__(self, stops: list[str], keep: bool = False):
        self._stops = [s for s in stops if s]
        self._keep = keep or not self._stops
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held: list[ev.TextDelta] = []
        self._held_text = ""
        self._tail = ""  # the last characters of all text, enough to find a match at the end

    def push(self, d: ev.TextDelta) -> list[ev.TextDelta]:
        """The deltas that can go out now."""
        if self._longest:
            self._tail = (self._tail + d.text)[-self._longest:]
        if self._keep:
            return [d]
        self._held.append(d)
        self._held_text += d.text
        cut = len(self._held_text) - self._hold_length(self._held_text)
        out: list[ev.TextDelta] = []
        while self._held and len(self._held[0].text) <= cut:
            first = self._held.pop(0)
            cut -= len(first.text)
            self._held_text = self._held_text[len(first.text):]
            out.append(first)
        return out

    def _hold_length(self, text: str) -> int:
        """The longest end of `text` that is the start of (or all of) a stop string."""
        if not text or not any(text[-1] in s for s in self._stops):
            return 0
        best = 0
        for s in self._stops:
            for n in range(min(len(s), len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    @property
    def cuts(self) -> bool:
        """Whether a matched stop string leaves the text (the client does not keep it)."""
        return not self._keep

    def matched(self) -> str | None:
        """The stop string the whole text ends with, the first in the client's order."""
        return next((s for s in self._stops if self._tail.endswith(s)), None)

    def release(self, cut: str | None = None) -> list[ev.TextDelta]:
        """Everything still held, without `cut` at its end (unless the client keeps it)."""
        held, self._held, self._held_text = self._held, [], ""
        remaining = len(cut) if cut and not self._keep else 0
        for d in reversed(held):
            if not remaining:
                break
            take = min(remaining, len(d.text))
            d.text = d.text[:len(d.text) - take]
            remaining -= take
        return [d for d in held if d.text or d.token_ids or d.logprobs]
