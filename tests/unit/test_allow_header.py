"""A 405 names every method the target resource takes (RFC 9110 section 15.5.6: the `Allow`
field lists "the target resource's currently supported methods"), where several routes share
a path: TGI's `/` (POST compat_generate, GET health, server.rs), Elasticsearch's
`_inference/{id}` and `_inference/{task_type}/{id}` (GET the endpoint, POST infer). Elasticsearch
lists them all too: RestController.handleUnsupportedHttpMethod writes the methods of every
handler at the path (getValidHandlerMethodSet) in its message and its Allow header."""

from __future__ import annotations

import orjson
import pytest

from gateway import config
from tests.fakes import hosts

CFG = config.Config.model_validate({
    "default_model": "m", "models": [{"name": "m", "upstreams": ["http://w:8000"]}]})


def _methods(value: str) -> set[str]:
    return {m.strip() for m in value.split(",") if m.strip()}


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("PUT", "/", {"GET", "HEAD", "POST"}),
    ("DELETE", "/_inference/m", {"GET", "HEAD", "POST"}),
    ("PUT", "/_inference/completion/m", {"GET", "HEAD", "POST"}),
    ("GET", "/v1/chat/completions", {"POST"}),
    ("PUT", "/v1/models", {"GET", "HEAD"}),
])
async def test_a_405_allows_every_method_of_the_path(method: str, path: str,
                                                     allowed: set[str]) -> None:
    async with hosts.serve(CFG, {}) as client:
        resp = await client.request(method, path)
        for other in allowed - {"HEAD"}:  # each one named is taken indeed
            assert (await client.request(other, path, json={})).status_code != 405
    assert resp.status_code == 405
    assert _methods(resp.headers["allow"]) == allowed
    if path.startswith("/_inference"):  # and named in Elasticsearch's message, as a Java set
        listed = orjson.loads(resp.content)["error"].rpartition("allowed: [")[2].rstrip("]")
        assert _methods(listed) == allowed
