"""Continuing an answer, as a greedy model would: the rest of the text, not a new one.

A gateway that fails a stream over asks another worker to go on from the text already sent:
chat with the text as the final assistant message and `continue_final_message: true` (vLLM
protocol.py), completions with the prompt plus the text. A real model asked so continues its
own deterministic (greedy) answer; the simulator does the same by regenerating the answer for
the original prompt and skipping the tokens already given. A continuation runs clean of the
stream fault directives its prompt still carries (`drop_after`, `hang_after`, `error_after`):
the worker that died was the first one, and a gateway may have received fewer tokens than
were sent before the cut (bytes in flight are lost with a reset connection), so the cut point
cannot be counted from the text given back.
"""

from __future__ import annotations

import dataclasses

from simulator import directives, tokens

MAX_SPLITS = 64  # completions: candidate cut points tried, from the end of the prompt
# Chat: the choice an answer being continued was (a gateway continues each choice of an `n`
# answer as a request of its own, n=1), the indices tried. Completions try choice 0 only: with
# no flag to mark a continuation, each request would pay for every index at every cut point.
MAX_CHOICES = 16


def resume_at(outcome: tokens.Outcome, prefix: str) -> int | None:
    """How many of `outcome`'s tokens make exactly `prefix` (None: not a prefix of it; a
    prefix that is the whole answer leaves nothing to continue, also None)."""
    text = ""
    for k, delta in enumerate(outcome.deltas):
        if text == prefix:
            return k or None
        text += delta or ""
        if not prefix.startswith(text):
            return None
    return None


def trim(outcome: tokens.Outcome, k: int, prefix: str) -> None:
    """Drop the first `k` tokens (already given) from a generated choice."""
    outcome.tokens = outcome.tokens[k:]
    outcome.deltas = outcome.deltas[k:]
    if outcome.content is not None:
        outcome.content = outcome.content[len(prefix):]


def uncut(faults: directives.Directives) -> directives.Directives:
    """The directives without their stream faults."""
    return dataclasses.replace(faults, drop_after=None, hang_after=None, error_after=None)


def splits(prompt: str) -> list[tuple[str, str]]:
    """(original prompt, text so far) candidates for a completions prompt, from the end: the
    text so far is whole tokens, each a space and a word (see tokens.VOCAB)."""
    out: list[tuple[str, str]] = []
    i = len(prompt)
    while len(out) < MAX_SPLITS:
        i = prompt.rfind(" ", 0, i)
        if i < 0:
            break
        if i + 1 < len(prompt) and prompt[i + 1] != " ":
            out.append((prompt[:i], prompt[i:]))
    return out


def first_word(key: bytes) -> str:
    """The first token a plain completion for choice key `key` emits (tokens._answer_tokens)."""
    return tokens.VOCAB[tokens._Rng(key).byte()]
