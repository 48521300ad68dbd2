"""Request bodies sent compressed: `Content-Encoding: gzip` or `deflate`.

Elasticsearch decompresses request bodies (Netty's HttpContentDecompressor in its HTTP
transport), and its clients compress them when asked (elasticsearch-py `http_compress=True`:
elastic-transport gzips the body and sets `Content-Encoding: gzip`), so an Elastic client so
configured sent the gateway bytes it read as broken JSON. Every route takes them, as a
superset of what the other protocols' servers do. The decompressed size is held to
`max_request_bytes` as it is made (a small body must not expand into a large one), and an
encoding the gateway cannot read is a 415 (RFC 9110 15.5.16).
"""

from __future__ import annotations

import zlib

from schemas import errors

# wbits: gzip's header and trailer (16 + MAX_WBITS); deflate is zlib's format (RFC 9110
# 8.4.1.2), which some clients send raw (-MAX_WBITS), so it is tried both ways.
_GZIP = (16 + zlib.MAX_WBITS,)
_DEFLATE = (zlib.MAX_WBITS, -zlib.MAX_WBITS)
CODINGS = {"gzip": _GZIP, "x-gzip": _GZIP, "deflate": _DEFLATE}


def decoded(body: bytes, header: str, limit: int) -> bytes:
    """`body` with the codings of a `Content-Encoding` header undone, last applied first."""
    codings = [c.strip().lower() for c in header.split(",")]
    for coding in reversed(codings):
        if coding in ("", "identity"):
            continue
        formats = CODINGS.get(coding)
        if formats is None:
            raise errors.MalformedBody(
                f"Content-Encoding {coding!r} is not supported (gzip, deflate)", status=415)
        body = _inflate(body, coding, formats, limit)
    return body


def _inflate(body: bytes, coding: str, formats: tuple[int, ...], limit: int) -> bytes:
    for wbits in formats:
        try:
            return _members(body, wbits, limit)
        except zlib.error:
            continue
    raise errors.MalformedBody(f"the request body is not valid {coding} data")


def _members(data: bytes, wbits: int, limit: int) -> bytes:
    """Every member of a (possibly concatenated, RFC 1952 2.2) stream, at most `limit` bytes."""
    out: list[bytes] = []
    size = 0
    while data:
        inflater = zlib.decompressobj(wbits)
        chunk = inflater.decompress(data, limit - size + 1)
        size += len(chunk)
        if size > limit or inflater.unconsumed_tail:
            raise errors.PayloadTooLarge(f"the request body exceeds {limit} bytes once "
                                         "decompressed")
        if not inflater.eof:
            raise zlib.error("truncated")
        out.append(chunk)
        data = inflater.unused_data
    return b"".join(out)
