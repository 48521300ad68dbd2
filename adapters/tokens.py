"""Token ids from a model's tokenizer, for clients whose format carries one on every token.

TGI stream tokens and LMI token lines always carry an id (TGI lib.rs `Token.id`, seed 003
`Token`), but trtllm-serve, Triton's ensemble and plain OpenAI servers return text only. A
request marked `per_token` gets ids, in this order of preference: the worker's; the model's
Hugging Face tokenizer (`models[].tokenizer`, read by gateway/ at startup and handed in as a
loaded object: adapters do no I/O); else -1, which clients read as "unknown" (TGI ids are u32,
so -1 never names a real token). Log probs are never invented: the worker's, else null.

Ids found by tokenizing the text are the tokenizer's reading of that text, which is the
model's own except where the model produced a non-canonical split; a text chunk of several
tokens (Triton streams) becomes one event per token, its text cut at the token offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from adapters import base
from schemas import events as ev

UNKNOWN_ID = -1


class Encoding(Protocol):
    """What `tokenizers.Encoding` gives: ids and the (start, end) character span of each."""

    @property
    def ids(self) -> list[int]: ...

    @property
    def offsets(self) -> list[tuple[int, int]]: ...


class TokenizerLike(Protocol):
    """The part of Hugging Face `tokenizers.Tokenizer` used here."""

    def encode(self, sequence: Any, pair: Any = None, is_pretokenized: bool = False,
               add_special_tokens: bool = True) -> Any: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def get_added_tokens_decoder(self) -> dict[int, Any]: ...


class Vocab:
    """A model's tokenizer, as adapters use it: text to ids, ids to text, special ids."""

    def __init__(self, tokenizer: TokenizerLike):
        self._tok = tokenizer
        # tokenizer.json `added_tokens[].special` (BOS, EOS, chat markers): TGI's `special`.
        self.special: frozenset[int] = frozenset(
            i for i, t in tokenizer.get_added_tokens_decoder().items()
            if getattr(t, "special", False))

    def split(self, text: str) -> list[tuple[int, str]]:
        """The tokens of `text`, each with the slice of `text` it stands for (cut where the
        previous token ends, so a token takes the blank before it, as BPE pieces do, and the
        slices join back to `text` exactly)."""
        enc: Encoding = self._tok.encode(text, add_special_tokens=False)
        ids, offsets = enc.ids, enc.offsets
        if not ids:
            return []
        cuts = [0] + [end for _, end in offsets[:-1]] + [len(text)]
        if any(b < a for a, b in zip(cuts, cuts[1:], strict=False)):
            return [(ids[0], text)] + [(i, "") for i in ids[1:]]  # offsets out of order
        return [(ids[k], text[cuts[k]:cuts[k + 1]]) for k in range(len(ids))]

    def id_of(self, token: str) -> int:
        """The id of one token's text, or -1 when the text is not exactly one token."""
        ids: list[int] = self._tok.encode(token, add_special_tokens=False).ids
        return ids[0] if len(ids) == 1 else UNKNOWN_ID

    def text_of(self, token_id: int) -> str:
        """One id's text, special tokens included (TGI writes `</s>` for the EOS token)."""
        return self._tok.decode([token_id], skip_special_tokens=False)


class Tokenized:
    """A worker's decoder whose text events get token ids from the vocabulary where the
    worker gave none, and token texts where it gave only ids (vLLM's `token_id:N`).

    Text that comes without per-token detail (a plain OpenAI server, Triton) need not break
    at token boundaries (a worker holding text back for a stop string sends " ", "spel",
    "l for"), so each choice's last piece is held until more text, its Finish or the end
    shows where it ends: the tokenizer splits the held text and what came after it."""

    def __init__(self, inner: base.StreamDecoder, vocab: Vocab):
        self._inner = inner
        self._vocab = vocab
        self._pending: dict[int, str] = {}  # choice -> text not yet sent as tokens

    @property
    def failed(self) -> bool:
        return self._inner.failed

    def feed(self, data: bytes) -> list[ev.Event]:
        return self._fill(self._inner.feed(data))

    def close(self) -> list[ev.Event]:
        out = self._fill(self._inner.close())
        for choice in sorted(self._pending):
            out += self._release(choice)
        return out

    def _fill(self, events: list[ev.Event]) -> list[ev.Event]:
        if not self._pending and not any(isinstance(e, ev.TextDelta) for e in events):
            return events
        out: list[ev.Event] = []
        for e in events:
            if isinstance(e, ev.TextDelta):
                out += self.delta(e)
            elif isinstance(e, ev.Finish):
                out += self._release(e.choice)
                out.append(e)
            else:
                out.append(e)
        return out

    def delta(self, e: ev.TextDelta) -> list[ev.TextDelta]:
        """`e` with ids (and id-only texts) filled in; plain text is split into tokens, the
        last one held back."""
        if e.logprobs is not None:
            self._texts(e.logprobs)
        if e.token_ids is not None:
            return [e]
        if e.logprobs:  # the worker's own token boundaries
            e.token_ids = [lp.id if lp.id is not None else self._vocab.id_of(lp.token)
                           for lp in e.logprobs]
            return [e]
        if not e.text:
            return [e]
        pieces = self._vocab.split(self._pending.pop(e.choice, "") + e.text)
        if not pieces:
            return []
        self._pending[e.choice] = pieces[-1][1]
        return [ev.TextDelta(e.choice, text, [tid]) for tid, text in pieces[:-1]]

    def _release(self, choice: int) -> list[ev.Event]:
        text = self._pending.pop(choice, "")
        if not text:
            return []
        pieces = self._vocab.split(text) or [(UNKNOWN_ID, text)]
        return [ev.TextDelta(choice, t, [tid]) for tid, t in pieces]

    def _texts(self, lps: list[ev.TokenLogprob]) -> None:
        """Texts of tokens the worker named by id only (an empty text with a known id)."""
        for lp in lps:
            if not lp.token and lp.id is not None:
                lp.token = self._vocab.text_of(lp.id)
            for a in lp.top:
                if not a.token and a.id is not None:
                    a.token = self._vocab.text_of(a.id)
