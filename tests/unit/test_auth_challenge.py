"""A 401 carries `WWW-Authenticate` (RFC 9110 section 11.6.1: a server generating a 401 MUST
send one), on inference and status routes of every protocol: `Bearer` (RFC 6750) and `ApiKey`
(the scheme Elasticsearch's security plugin challenges with, x-pack Security.java), the schemes
every route takes."""

from __future__ import annotations

import pytest

from gateway import config
from tests.fakes import hosts

CFG = config.Config.model_validate({
    "server": {"api_keys": ["k1"]}, "default_model": "m",
    "models": [{"name": "m", "upstreams": ["http://w:8000"]}]})


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/chat/completions", {"model": "m", "messages": []}),
    ("GET", "/v1/models", None),
    ("POST", "/generate", {"inputs": "hi"}),
    ("POST", "/invocations", {"inputs": "hi"}),
    ("POST", "/_inference/chat_completion/m/_stream", {"messages": []}),
])
async def test_a_401_challenges_with_the_schemes_taken(method: str, path: str,
                                                        body: object) -> None:
    async with hosts.serve(CFG, {}) as client:
        resp = await client.request(method, path, json=body)
        ok = await client.request(method, path, json=body, headers={"authorization": "Bearer k1"})
    assert resp.status_code == 401
    challenges = [c.strip() for c in resp.headers["www-authenticate"].split(",")]
    assert challenges == ["Bearer", "ApiKey"]
    assert ok.status_code != 401 and "www-authenticate" not in ok.headers
