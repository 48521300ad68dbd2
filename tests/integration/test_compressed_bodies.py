"""Request bodies sent compressed, end to end (gateway/content_encoding.py).

elasticsearch-py with `http_compress=True` gzips every request body and says so in
`content-encoding: gzip` (elastic-transport `_node/_http_urllib3.py`); Elasticsearch reads such
bodies (its Netty HTTP transport's `HttpContentDecompressor`). The gateway read them as broken
JSON. Every protocol's routes now take gzip and deflate, and answer a coding they cannot read
with 415 in the caller's own error body (RFC 9110 15.5.16).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import httpx
import orjson
import pytest
from elasticsearch import Elasticsearch

from tests.integration import procs

pytestmark = pytest.mark.integration

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "Hi [[sim tokens=3]]"}],
        "max_tokens": 3}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("compressed")
    with procs.demo_gateway(tmp, "{}") as (gw_url, _):
        yield gw_url


def test_an_elasticsearch_client_that_compresses_its_bodies(url: str) -> None:
    es = Elasticsearch(url, request_timeout=20, max_retries=0, http_compress=True)
    resp = es.inference.completion(inference_id="demo", input="Hi [[sim tokens=3]]")
    assert resp.meta.status == 200
    assert resp.body["completion"][0]["result"]
    streamed = es.perform_request(
        "POST", "/_inference/chat_completion/demo/_stream",
        headers={"accept": "text/event-stream", "content-type": "application/json"},
        body={"messages": CHAT["messages"]})
    assert streamed.body.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", CHAT),
    ("/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 3}}),
    ("/invocations", {"inputs": "Hi", "parameters": {"max_new_tokens": 3}}),
])
def test_every_protocol_takes_a_gzipped_body(url: str, path: str, body: dict[str, object]
                                             ) -> None:
    resp = httpx.post(url + path, content=gzip.compress(orjson.dumps(body)), timeout=20,
                      headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(("path", "body", "expected"), [
    ("/v1/chat/completions", CHAT, {"error": {
        "message": "Content-Encoding 'br' is not supported (gzip, deflate)",
        "type": "invalid_request_error", "param": None, "code": None}}),
    # TGI: a body its JSON extractor cannot read is axum's plain-text rejection
    # (adapters/frontends/tgi_extract.py)
    ("/generate", {"inputs": "Hi"}, "Content-Encoding 'br' is not supported (gzip, deflate)"),
])
def test_a_coding_the_gateway_cannot_read_is_a_415_in_the_callers_form(
        url: str, path: str, body: dict[str, object], expected: object) -> None:
    resp = httpx.post(url + path, content=orjson.dumps(body), timeout=20,
                      headers={"content-type": "application/json", "content-encoding": "br"})
    assert resp.status_code == 415
    assert (resp.json() if isinstance(expected, dict) else resp.text) == expected
