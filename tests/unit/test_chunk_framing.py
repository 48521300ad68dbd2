"""A streamed response's body chunks as the gateway's server frames them (RFC 9112 section
7.1: the size in hex, CRLF, the data, CRLF), read back by httptools, the parser its clients'
servers and uvicorn use, at sizes on both sides of the prebuilt size lines."""

from __future__ import annotations

import httptools
import pytest

from gateway import http_cycle


@pytest.mark.parametrize("size", [0, 1, 9, 10, 255, 256, 4095, 4096, 4097, 70_000])
def test_a_chunk_is_its_size_in_hex_then_its_bytes(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    assert http_cycle.chunk(body) == b"%x\r\n%b\r\n" % (size, body)


def test_chunks_read_back_as_the_body() -> None:
    parts = [b"data: a\n\n", b"y" * 5000, b"data: [DONE]\n\n"]
    got: list[bytes] = []

    class Sink:
        def on_body(self, data: bytes) -> None:
            got.append(data)

    parser = httptools.HttpResponseParser(Sink())
    parser.feed_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                     + b"".join(http_cycle.chunk(p) for p in parts) + b"0\r\n\r\n")
    assert b"".join(got) == b"".join(parts)
