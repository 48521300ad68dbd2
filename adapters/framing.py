"""Wire framings shared by several protocols: SSE and JSON-lines writers, an incremental SSE reader.

The per-read tests look for a byte by its value, `CR in data`: on CPython 3.11 `in` first
tries its needle as an integer (`_Py_bytes_contains` calls `PyNumber_AsSsize_t`), so a bytes
needle formats and discards a TypeError, about 1,800 instructions a test (bench/RESULTS.md
section 14), and `bytes.find` parses its arguments as a tuple, about 1,000; an integer needle
goes straight to the search.
"""

from __future__ import annotations

from typing import Final

import orjson

SSE_DONE = b"data: [DONE]\n\n"
CR: Final = 13  # b"\r", as a needle for `in`
LF: Final = 10  # b"\n"
BOM: Final[bytes] = b"\xef\xbb\xbf"  # UTF-8's byte order mark
QUOTE: Final = 34  # b'"'
BACKSLASH: Final = 92  # b"\\"


def json_plain(data: bytes, start: int, stop: int) -> bool:
    """Whether `data[start:stop]` holds no byte a JSON string escapes (a quote, a backslash,
    a control byte). Such UTF-8 is its own JSON string body, as orjson writes it and reads it
    (orjson escapes nothing else: not `/`, DEL, U+2028 or any other non-ASCII): a token's
    text then crosses without `orjson.loads` (about 1,250 instructions for a few bytes) or
    `orjson.dumps` (about 600) (bench/RESULTS.md §34c)."""
    i = start
    while i < stop:
        b = data[i]
        if b < 32 or b == QUOTE or b == BACKSLASH:
            return False
        i += 1
    return True


def json_body(text: str) -> bytes:
    """`text` as the inside of a JSON string, byte for byte as `orjson.dumps` writes it."""
    try:
        raw = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: orjson refuses it
        return orjson.dumps(text)
    return raw if json_plain(raw, 0, len(raw)) else orjson.dumps(text)[1:-1]


def sse(data: bytes) -> bytes:
    """One SSE event: `data: ` with one space, as every current server writes it."""
    return b"data: " + data + b"\n\n"


def sse_event(name: bytes, data: bytes, prefix: bytes = b"") -> bytes:
    """An SSE event with an `event:` line (Elastic); `prefix` is written before it (a BOM)."""
    return prefix + b"event: " + name + b"\ndata: " + data + b"\n\n"


def jsonline(data: bytes) -> bytes:
    return data + b"\n"


class SseDecoder:
    """Incremental SSE parser (WHATWG rules) that is right for any chunking of the input.

    `feed` returns the completed events as (event name, data) pairs; comments and `id:` /
    `retry:` lines are dropped. Accepts `data:` with or without the space, CRLF, CR or LF line
    ends, and trailing spaces before the blank line (trtllm-serve writes `} \\n\\n`).
    """

    __slots__ = ("_buf", "_data", "_event", "_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event = b""
        self._cr = False  # the last read ended on CR: a LF that opens the next one ends no line

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        if self._cr:
            # WHATWG: CRLF is one line end, also when a read boundary falls between its bytes;
            # read as two, the LF would be a blank line and dispatch a multi-line event early.
            self._cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not self._buf and not self._data and not self._event and chunk[-2:] == b"\n\n" \
                and CR not in chunk:
            if chunk[:6] == b"data: ":
                data = chunk[6:-2]
                if LF not in data:
                    return [(b"message", data)]  # one event of one line: a token's read
            return self._whole_events(chunk)
        return self._general(chunk)

    def _general(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        buf = self._buf + chunk if self._buf else chunk
        if CR in buf:
            self._cr = buf[-1:] == b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[tuple[bytes, bytes]] = []
        for line in lines:
            if not line or line.isspace():
                if self._data:
                    out.append((self._event or b"message", b"\n".join(self._data)))
                    self._data = []
                self._event = b""
            else:
                self._line(line)
        return out

    def _whole_events(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """Fast path: a read that ends on an event boundary, as workers write them."""
        out: list[tuple[bytes, bytes]] = []
        for block in chunk[:-2].split(b"\n\n"):
            if block[:6] == b"data: " and LF not in block:
                out.append((b"message", block[6:]))
            else:
                out.extend(self._general(block + b"\n\n"))
        return out

    def _line(self, line: bytes) -> None:
        if line[0] == 58:  # b":" comment / keep-alive
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value
        elif name[:3] == BOM and len(line) > 3:  # Elasticsearch writes one before every event,
            self._line(line[3:])  # and a stream may open with one (WHATWG: the decoder strips
            # it): the line after it is read as any other

    def close(self) -> list[tuple[bytes, bytes]]:
        """Flush an event the peer did not terminate with a blank line."""
        self._cr = False
        out = self._general(b"\n\n") if (self._buf or self._data) else []
        self._buf = b""
        self._event = b""
        return out

    @property
    def pending(self) -> bool:
        return bool(self._buf.strip() or self._data)


class LineDecoder:
    """Incremental JSON Lines reader (LMI's `jsonlines` framing, wire-formats.md section 1):
    complete non-blank lines, CR, LF or CRLF ended, right for any chunking."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        if CR in buf:
            # A CR at the end may be the first half of a CRLF: kept until the next read.
            buf = buf.replace(b"\r\n", b"\n")
            cut = len(buf) - 1 if buf[-1:] == b"\r" else len(buf)
            buf = buf[:cut].replace(b"\r", b"\n") + buf[cut:]
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        return [line for line in lines if line and not line.isspace()]

    def close(self) -> list[bytes]:
        """The last line, when the peer did not end it."""
        tail, self._buf = self._buf.rstrip(b"\r"), b""
        return [tail] if tail.strip() else []

    @property
    def pending(self) -> bool:
        return bool(self._buf.strip())
