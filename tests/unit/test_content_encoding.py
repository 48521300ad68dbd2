"""Compressed request bodies (gateway/content_encoding.py).

Sources: elastic-transport `_node/_http_urllib3.py` (with `http_compress`, `gzip.compress(body)`
and `content-encoding: gzip`); Elasticsearch's HTTP transport decompresses request bodies
(Netty `HttpContentDecompressor`: gzip, x-gzip, deflate); RFC 9110 8.4 (codings listed in the
order applied) and 15.5.16 (415 for a coding the server cannot read); RFC 1952 2.2 (a gzip file
may hold several members).
"""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import content_encoding
from schemas import errors

BODY = b'{"input": "' + b"hello " * 50 + b'"}'


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(("header", "packed"), [
    ("gzip", gzip.compress(BODY)),
    ("x-gzip", gzip.compress(BODY)),
    ("GZIP", gzip.compress(BODY)),
    ("deflate", zlib.compress(BODY)),
    ("deflate", raw_deflate(BODY)),
    ("identity", BODY),
    ("gzip, identity", gzip.compress(BODY)),
    ("deflate, gzip", gzip.compress(zlib.compress(BODY))),
    ("gzip", gzip.compress(BODY[:40]) + gzip.compress(BODY[40:])),
])
def test_each_coding_is_undone(header: str, packed: bytes) -> None:
    assert content_encoding.decoded(packed, header, 1 << 20) == BODY


@given(st.binary(max_size=4096))
def test_any_gzipped_body_within_the_limit_comes_back_whole(data: bytes) -> None:
    assert content_encoding.decoded(gzip.compress(data), "gzip", 4096) == data


def test_a_body_that_expands_past_the_limit_is_a_413() -> None:
    """A small body must not become a large one: the inflater stops at the limit."""
    bomb = gzip.compress(b"\0" * (10 << 20))
    assert len(bomb) < 20_000
    with pytest.raises(errors.PayloadTooLarge) as info:
        content_encoding.decoded(bomb, "gzip", 1 << 20)
    assert info.value.status == 413


def test_a_limit_met_exactly_is_taken() -> None:
    assert content_encoding.decoded(gzip.compress(BODY), "gzip", len(BODY)) == BODY
    with pytest.raises(errors.PayloadTooLarge):
        content_encoding.decoded(gzip.compress(BODY), "gzip", len(BODY) - 1)


@pytest.mark.parametrize("header", ["br", "zstd", "gzip, br"])
def test_a_coding_the_gateway_cannot_read_is_a_415(header: str) -> None:
    with pytest.raises(errors.MalformedBody) as info:
        content_encoding.decoded(BODY, header, 1 << 20)
    assert info.value.status == 415
    assert "is not supported (gzip, deflate)" in info.value.message


@pytest.mark.parametrize("packed", [BODY, gzip.compress(BODY)[:-12]])
def test_bytes_that_are_not_gzip_or_cut_short_are_a_400(packed: bytes) -> None:
    with pytest.raises(errors.MalformedBody) as info:
        content_encoding.decoded(packed, "gzip", 1 << 20)
    assert info.value.status == 400
    assert info.value.message == "the request body is not valid gzip data"
