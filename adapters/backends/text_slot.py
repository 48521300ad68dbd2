"""A stream's chunks that differ only in their text, read without parsing the rest again.

Within one answer an OpenAI-compatible worker writes every text chunk with the same id,
`created`, model and nulls: vLLM's `data: {"id":"chatcmpl-…",…,"delta":{"content":" great"},
"logprobs":null,"finish_reason":null}`. Parsing all of it (`orjson.loads` builds a dict a
level) and reading it back was a third of a paced chunk's instructions (bench/RESULTS.md
§32). A `TextSlot` is the bytes before and after the text's JSON string in one such chunk:
a later event with the same bytes around a JSON string is that chunk with another text, so
only the string is parsed. Anything else (a role, a finish, usage, logprobs, token ids, an
error, another choice) differs around the string and is read in full.

A slot is learned from a chunk already parsed and proved before use: the chunk with a probe
string in the slot must parse to the same object with the probe as its text. So a key of the
same name elsewhere, a duplicated key or spaces around the colon cannot make a wrong slot.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from adapters import framing

_loads: Final = orjson.loads
QUOTE: Final = framing.QUOTE
BACKSLASH: Final = framing.BACKSLASH
# No worker writes this text; what the slot holds is replaced by it to prove the slot.
PROBE: Final = "\x00text-slot probe\x00"
_PROBE_JSON: Final[bytes] = orjson.dumps(PROBE)
SEARCHED: Final = 4  # occurrences of the key tried in one chunk


class TextSlot:
    """The bytes around one choice's text in a chunk; `text` reads another chunk's text."""

    def __init__(self, head: bytes, tail: bytes, choice: int) -> None:
        self.head = head
        self.tail = tail
        self.choice = choice
        self._around = len(head) + len(tail)

    def text(self, payload: bytes) -> str | None:
        """The text of `payload` when it is this slot's chunk with another text, else None."""
        size = len(payload)
        n = len(self.head)
        end = size - len(self.tail)
        # (mypyc compiles `startswith` and `endswith` on bytes to a memcmp: no slice made)
        if size < self._around + 2 or not payload.startswith(self.head) \
                or not payload.endswith(self.tail):
            return None
        last = end - 1
        # a string with nothing to unescape is its UTF-8 bytes; invalid UTF-8 goes to the
        # parser, which decides as before
        if payload[n] == QUOTE and payload[last] == QUOTE \
                and framing.json_plain(payload, n + 1, last):
            try:
                return payload[n + 1:last].decode()
            except UnicodeDecodeError:
                pass
        try:
            value = _loads(payload[n:end])  # one JSON value, nothing after it
        except orjson.JSONDecodeError:
            return None
        return value if type(value) is str else None


def learn(payload: bytes, obj: dict[str, Any], holder: dict[str, Any], field: str,
          choice: int) -> TextSlot | None:
    """The slot of `holder[field]` (a string inside `obj`, parsed from `payload`), or None
    where it cannot be proved."""
    original = holder[field]
    if type(original) is not str or original == PROBE:
        return None
    key = b'"' + field.encode() + b'":'
    start = 0
    for _ in range(SEARCHED):
        k = payload.find(key, start)
        if k < 0:
            return None
        at = _value_start(payload, k + len(key))
        end = _string_end(payload, at)
        if end > 0:
            slot = TextSlot(payload[:at], payload[end:], choice)
            if _proved(slot, obj, holder, field, original):
                return slot
        start = k + 1
    return None


def _value_start(payload: bytes, i: int) -> int:
    """Past the JSON whitespace at `i`."""
    while i < len(payload) and payload[i] in (32, 9, 10, 13):
        i += 1
    return i


def _string_end(payload: bytes, i: int) -> int:
    """Just past the JSON string that opens at `i`, or -1 if none does."""
    if i >= len(payload) or payload[i] != QUOTE:
        return -1
    i += 1
    while i < len(payload):
        b = payload[i]
        if b == BACKSLASH:
            i += 2
        elif b == QUOTE:
            return i + 1
        else:
            i += 1
    return -1


def _proved(slot: TextSlot, obj: dict[str, Any], holder: dict[str, Any], field: str,
            original: str) -> bool:
    """Whether the chunk with the probe in the slot parses to `obj` with the probe as its
    text, and nothing else changed."""
    try:
        probed = _loads(slot.head + _PROBE_JSON + slot.tail)
    except orjson.JSONDecodeError:
        return False
    holder[field] = PROBE
    try:
        return bool(probed == obj)
    finally:
        holder[field] = original
