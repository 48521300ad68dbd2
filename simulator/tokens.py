"""Deterministic vocabulary, tokenizer and generation: the same request, the same tokens.

Randomness comes from blake2b in counter mode (never Python's salted `hash()`), so outputs are
stable across processes and runs. Finish rules follow vLLM v1: the length cap is checked before
EOS and stop token ids (`v1/core/sched/utils.py check_stop`), a stop token's text is dropped, and
stop strings are found by the detokenizer, which holds back `max(len(stop)) - 1` characters
while streaming and truncates the output at the match (`v1/engine/detokenizer.py`), or, with
`include_stop_str_in_output`, holds nothing back and keeps the match (its stop_buffer_length is
then 0; `StopChecker.check_stop_strings` truncates after the stop string).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

_WORDS = """
the of and to in is it you that he was for on are with as his they be at one have this from or
had by word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know
water than call first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant cover food
sun four between state keep eye never last let thought city tree cross farm hard late run while
press close night real life few north open seem together next white children begin got walk
example ease paper group always music those both mark""".split()  # noqa: SIM905

VOCAB: tuple[str, ...] = tuple(" " + w for w in _WORDS)  # token text, leading space as in BPE
VOCAB_BASE = 1000  # token id of VOCAB[i] is VOCAB_BASE + i
BOS_ID, EOS_ID, THINK_END_ID, MSG_END_ID = 1, 2, 3, 7
ROLE_IDS = {"system": 10, "developer": 11, "user": 12, "assistant": 13, "tool": 14}
OTHER_ROLE_ID = 15
FRAGMENT_BASE = 100_000  # JSON / tool-call fragments
UNKNOWN_BASE = 200_000  # prompt words outside VOCAB
SPECIAL_TEXT = {BOS_ID: "<s>", EOS_ID: "</s>", THINK_END_ID: "</think>", MSG_END_ID: "<|end|>"}
_WORD_ID = {w: VOCAB_BASE + i for i, w in enumerate(_WORDS)}
assert len(VOCAB) == 256 and len(_WORD_ID) == 256

# Token kinds: which output channel a token feeds.
REASONING, CONTENT, THINK_END, EOS, TOOL_HEAD, TOOL_ARGS = range(6)
_FRAGMENT_CHARS = 8  # tool-call / JSON text is streamed in pieces of this many characters


def encode(text: str) -> list[int]:
    """Prompt text to ids, one per whitespace-separated word (cheap: no hashing per word)."""
    get = _WORD_ID.get
    return [get(w) or UNKNOWN_BASE + zlib.crc32(w.encode()) % 100_000 for w in text.split()]


def encode_chat(messages: list[tuple[str, str]]) -> list[int]:
    """Chat prompt ids as a template would lay them out: BOS, role+text+end each, assistant."""
    ids = [BOS_ID]
    for role, text in messages:
        ids.append(ROLE_IDS.get(role, OTHER_ROLE_ID))
        ids.extend(encode(text))
        ids.append(MSG_END_ID)
    ids.append(ROLE_IDS["assistant"])
    return ids


def token_text(token_id: int) -> str:
    """Text of one id as vLLM's logprobs show it (special tokens by name)."""
    if VOCAB_BASE <= token_id < VOCAB_BASE + len(VOCAB):
        return VOCAB[token_id - VOCAB_BASE]
    return SPECIAL_TEXT.get(token_id, f" <{token_id}>")


def decode(ids: list[int]) -> str:
    """Ids to text, skipping special tokens (vLLM `skip_special_tokens=True`)."""
    return "".join(token_text(i) for i in ids if i not in SPECIAL_TEXT)


def digest(*parts: object) -> bytes:
    """A stable 32-byte key for `parts` (prompt, seeds, choice index, ...)."""
    return blake2b("\x1f".join(map(str, parts)).encode(), digest_size=32).digest()


class _Rng:
    """An endless deterministic byte stream: blake2b(key || counter)."""

    __slots__ = ("_buf", "_key", "_n", "_pos")

    def __init__(self, key: bytes) -> None:
        self._key, self._buf, self._pos, self._n = key, b"", 0, 0

    def byte(self) -> int:
        """Next byte of the stream."""
        if self._pos >= len(self._buf):
            self._buf = blake2b(self._key + self._n.to_bytes(8, "little")).digest()
            self._n, self._pos = self._n + 1, 0
        self._pos += 1
        return self._buf[self._pos - 1]


@dataclass(slots=True)
class Token:
    """One generated token: its id, the text it adds, its channel and its logprob."""

    id: int
    text: str
    kind: int
    logprob: float
    alt: int  # VOCAB index where its lower-ranked alternatives start

    @property
    def logprob_text(self) -> str:
        """The token string vLLM puts in logprobs (EOS shows as `</s>`)."""
        return self.text or token_text(self.id)

    def top(self, k: int) -> list[tuple[str, float]]:
        """The k most likely tokens at this step: this one first, then lower alternatives."""
        return [(self.logprob_text if j == 0 else token_text(i), lp)
                for j, (i, lp) in enumerate(self.top_ids(k))]

    def top_ids(self, k: int) -> list[tuple[int, float]]:
        """`top` by id: this token's id first, then the alternatives' VOCAB ids."""
        alts = [(self.id, self.logprob)] if k > 0 else []
        for j in range(1, k):
            alts.append((VOCAB_BASE + (self.alt + 7 * j) % len(VOCAB),
                         round(self.logprob - 0.75 * j, 4)))
        return alts

    def shown(self, as_id: bool) -> str:
        """The token string in logprobs: its text, or with vLLM's
        `return_tokens_as_token_ids` the `token_id:N` placeholder (serving_engine.py
        _get_decoded_token)."""
        return f"token_id:{self.id}" if as_id else self.logprob_text


PromptStep = list[tuple[int, float, int]]  # (token id, logprob, rank), the prompt token first


def prompt_logprobs(ids: list[int], k: int) -> list[PromptStep | None]:
    """vLLM's prompt logprobs: None for the first token (nothing predicts it); for each later
    one the token itself with its rank, then the top k by rank, a token already listed not
    repeated (v1/engine/logprobs.py _make_logprob_dict). Each step depends only on the token
    and the one before it, so a prompt's logprobs do not depend on what follows."""
    out: list[PromptStep | None] = [None] if ids else []
    for prev, cur in zip(ids, ids[1:], strict=False):
        rng = _Rng(digest("prompt", prev, cur))
        rank, best, start = 1 + rng.byte() % 4, round(-0.05 - rng.byte() / 256, 4), rng.byte()
        alts = iter(i for j in range(k + 1)
                    if (i := VOCAB_BASE + (start + 7 * j) % len(VOCAB)) != cur)
        step = [(cur, round(best - 0.75 * (rank - 1), 4), rank)]
        step += [(next(alts), round(best - 0.75 * (r - 1), 4), r)
                 for r in range(1, k + 1) if r != rank]
        out.append(step)
    return out


@dataclass(frozen=True, slots=True)
class GenSpec:
    """Everything that shapes one choice's output, validated by the caller."""

    tokens: int = 16
    max_tokens: int = 8192
    reasoning: int = 0
    ignore_eos: bool = False
    finish: str | None = None  # "length": the natural end is a length cut, not EOS
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    include_stop: bool = False  # include_stop_str_in_output
    tool: tuple[str, dict[str, Any]] | None = None  # function name, its parameter properties
    json_props: dict[str, Any] | None = None  # response_format: {} means json_object


@dataclass(slots=True)
class ToolCall:
    """The tool call a choice makes; `arguments` is as far as generation got."""

    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class Outcome:
    """One choice, fully generated: tokens, streamed deltas and how it finished."""

    tokens: list[Token] = field(default_factory=list)
    deltas: list[str | None] = field(default_factory=list)  # None: the step sends no chunk
    finish_reason: str = "stop"
    stop_reason: str | int | None = None
    content: str | None = None
    reasoning: str | None = None
    tool: ToolCall | None = None

    @property
    def token_ids(self) -> list[int]:
        """All generated ids, EOS and stop tokens included (vLLM counts them)."""
        return [t.id for t in self.tokens]


def _word(rng: _Rng, kind: int) -> Token:
    """A vocabulary token with a deterministic logprob in [-2, -0.005]."""
    idx, lp = rng.byte(), rng.byte()
    return Token(VOCAB_BASE + idx, VOCAB[idx], kind, round(-0.005 - lp / 128, 4), idx + 1)


def _special(rng: _Rng, token_id: int, kind: int) -> Token:
    """EOS or end-of-thinking: no output text."""
    lp = rng.byte()
    return Token(token_id, "", kind, round(-0.001 - lp / 512, 4), lp)


def _fragment(rng: _Rng, text: str, kind: int) -> Token:
    """A piece of JSON text as one token."""
    lp = rng.byte()
    token_id = FRAGMENT_BASE + zlib.crc32(text.encode()) % 100_000
    return Token(token_id, text, kind, round(-0.001 - lp / 1024, 4), lp)


def _value(schema: Any, rng: _Rng) -> Any:
    """A deterministic value fitting a JSON-schema property."""
    b = rng.byte()
    if not isinstance(schema, dict):
        return VOCAB[b].strip()
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][b % len(schema["enum"])]
    kind = schema.get("type")
    table: dict[Any, Any] = {
        "integer": b % 100,
        "number": round(b / 10, 1),
        "boolean": b % 2 == 0,
        "array": [],
        "object": {},
        "null": None,
    }
    return table.get(kind, VOCAB[b].strip()) if isinstance(kind, str) else VOCAB[b].strip()


def build_object(props: dict[str, Any], rng: _Rng) -> str:
    """JSON text with one deterministic value per property, spaced as `json.dumps` writes it."""
    return json.dumps({k: _value(v, rng) for k, v in props.items()}, ensure_ascii=False)


def _pieces(text: str) -> list[str]:
    """Cut JSON text into streaming fragments."""
    return [text[i : i + _FRAGMENT_CHARS] for i in range(0, len(text), _FRAGMENT_CHARS)]


def _answer_tokens(spec: GenSpec, rng: _Rng) -> Iterator[Token]:
    """The answer part: tool call, JSON object or plain words."""
    if spec.tool is not None:
        name, props = spec.tool
        yield _fragment(rng, name, TOOL_HEAD)
        for piece in _pieces(build_object(props, rng)):
            yield _fragment(rng, piece, TOOL_ARGS)
    elif spec.json_props:
        for piece in _pieces(build_object(spec.json_props, rng)):
            yield _fragment(rng, piece, CONTENT)
    elif spec.json_props is not None:  # json_object: {"answer": "<words>"}
        yield _fragment(rng, '{"answer": "', CONTENT)
        for i in range(spec.tokens):
            word = _word(rng, CONTENT)
            word.text = word.text[1:] if i == 0 else word.text
            yield word
        yield _fragment(rng, '"}', CONTENT)
    else:
        for _ in range(spec.tokens):
            yield _word(rng, CONTENT)


def _natural(spec: GenSpec, rng: _Rng) -> Iterator[Token]:
    """The sequence a model would emit with no limits: thinking, answer, then EOS."""
    for _ in range(spec.reasoning):
        yield _word(rng, REASONING)
    if spec.reasoning:
        yield _special(rng, THINK_END_ID, THINK_END)
    emitted = spec.reasoning > 0
    for tok in _answer_tokens(spec, rng):
        emitted = True
        yield tok
    if spec.ignore_eos:
        while True:
            yield _word(rng, CONTENT)
    if spec.finish != "length" or not emitted:  # a model always emits at least one token
        yield _special(rng, EOS_ID, EOS)


class _ContentText:
    """Content detokenizer state: stop-string search and streaming hold-back.

    A match can only end in the text just added, so each step searches the unshown tail
    (`pending`) behind the last `max(len(stop)) - 1` shown characters (`recent`); shown text is
    only appended to a list (linear in the output length).
    """

    __slots__ = ("holdback", "include", "keep", "pending", "recent", "shown", "stop")

    def __init__(self, stop: tuple[str, ...], include: bool = False) -> None:
        self.stop, self.include = stop, include
        self.keep = max((len(s) for s in stop), default=1) - 1
        self.holdback = 0 if include else self.keep  # detokenizer.py stop_buffer_length
        self.shown: list[str] = []
        self.pending = self.recent = ""

    @property
    def text(self) -> str:
        """All content so far, after any stop-string cut."""
        return "".join(self.shown) + self.pending

    def add(self, piece: str) -> str | None:
        """Append text; on a stop string truncate at it (after it with `include`) and return it
        (first in `stop` order)."""
        self.pending += piece
        text = self.recent + self.pending
        for s in self.stop:
            i = text.find(s)
            if i != -1:
                self.pending = text[len(self.recent) : i + len(s) if self.include else i]
                return s
        return None

    def delta(self, finished: bool) -> str:
        """New visible text since the last call; the tail that may start a stop is held back."""
        end = len(self.pending) - (0 if finished else self.holdback)
        if end <= 0:
            return ""
        piece, self.pending = self.pending[:end], self.pending[end:]
        self.shown.append(piece)
        self.recent = (self.recent + piece)[-self.keep :] if self.keep else ""
        return piece


def _engine_finish(spec: GenSpec, tok: Token, k: int) -> tuple[str | None, int | None]:
    """vLLM v1 check_stop order: length cap, then EOS, then stop token ids."""
    if k >= spec.max_tokens:
        return "length", None
    if tok.kind == EOS:
        return "stop", None
    if tok.id in spec.stop_token_ids:
        return "stop", tok.id
    return None, None


def _lookahead(tokens: Iterator[Token]) -> Iterator[tuple[Token, bool]]:
    """Pair each token with whether it is the last the model would emit."""
    nxt = next(tokens, None)
    while nxt is not None:
        tok, nxt = nxt, next(tokens, None)
        yield tok, nxt is None


def _delta(out: Outcome, text: _ContentText, tok: Token, finish: str | None) -> str | None:
    """What this token adds to its channel; None when the step sends no chunk."""
    if tok.kind == REASONING:
        return tok.text
    if tok.kind == TOOL_HEAD:
        out.tool = ToolCall(out.tool.id if out.tool else "", tok.text)
        return tok.text
    if tok.kind == TOOL_ARGS:
        if out.tool is not None:
            out.tool.arguments += tok.text
        return tok.text
    if tok.kind == CONTENT:
        # v1 detokenizer: a stop token's text is dropped unless include_stop_str_in_output
        dropped = finish == "stop" and out.stop_reason is not None and not text.include
        if not dropped and (matched := text.add(tok.text)) is not None:
            out.finish_reason, out.stop_reason = "stop", matched
            finish = "stop"
    if tok.kind == THINK_END and finish is None:
        return None
    return text.delta(finish is not None)


def generate(spec: GenSpec, key: bytes, tool_id: str = "") -> Outcome:
    """Run one choice to its end; `key` (see `digest`) fixes every token."""
    out = Outcome(tool=ToolCall(tool_id, "") if spec.tool else None)
    text = _ContentText(spec.stop, spec.include_stop)
    for k, (tok, last) in enumerate(_lookahead(_natural(spec, _Rng(key))), 1):
        out.tokens.append(tok)
        finish, out.stop_reason = _engine_finish(spec, tok, k)
        if finish is None and last:
            finish = "length"  # finish=length directive: the natural end is a cut
        out.finish_reason = finish or ""
        out.deltas.append(_delta(out, text, tok, finish))
        if out.finish_reason:
            break
    if spec.reasoning:
        out.reasoning = "".join(t.text for t in out.tokens if t.kind == REASONING)
    thought = not spec.reasoning or any(t.kind == THINK_END for t in out.tokens)
    out.content = text.text if thought and spec.tool is None else None
    return out
