"""A missing or wrong API key, on every protected route, answers 401 in the error body of that
route's protocol; health and metrics stay open (SPEC.md `server.api_keys`; issue 12)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway import config
from tests.fakes import hosts

CFG = config.Config.model_validate({
    "server": {"api_keys": ["k1"]}, "default_model": "m",
    "models": [{"name": "m", "upstreams": ["http://w:8000"]}]})

OPENAI = {"message": "a valid API key is required", "type": "invalid_request_error",
          "param": None, "code": "invalid_api_key"}
TGI = {"error": "a valid API key is required", "error_type": "unauthorized"}
LMI = {"error": "a valid API key is required", "code": 401}

# (method, path, body, the protocol's 401 body or a check of it)
ROUTES: list[tuple[str, str, dict[str, Any] | None, Any]] = [
    ("GET", "/v1/models", None, {"error": OPENAI}),
    ("GET", "/info", None, TGI),
    ("POST", "/v1/completions", {"model": "m", "prompt": "hi"}, {"error": OPENAI}),
    ("POST", "/generate", {"inputs": "hi"}, TGI),
    ("POST", "/generate_stream", {"inputs": "hi"}, TGI),
    ("POST", "/", {"inputs": "hi"}, TGI),
    ("POST", "/invocations", {"inputs": "hi"}, LMI),
    ("POST", "/predictions/m", {"inputs": "hi"}, LMI),
    ("POST", "/_inference/completion/m", {"input": "hi"}, "security_exception"),
    ("POST", "/_inference/chat_completion/m/_stream",
     {"messages": [{"role": "user", "content": "hi"}]}, "security_exception"),
]
WRONG = [{}, {"authorization": "Bearer nope"}, {"x-api-key": "nope"}, {"authorization": "k1"}]


async def ask(method: str, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    async with hosts.serve(CFG, {}) as client:
        return await client.request(method, path, json=body, headers=headers)


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path", "body", "expected"), ROUTES,
                         ids=[f"{m} {p}" for m, p, _, _ in ROUTES])
@pytest.mark.parametrize("headers", WRONG, ids=["missing", "bearer", "x-api-key", "no-scheme"])
async def test_missing_or_wrong_key_is_401_in_the_routes_protocol(
        method: str, path: str, body: Any, expected: Any, headers: dict[str, str]) -> None:
    resp = await ask(method, path, body, headers)
    assert resp.status_code == 401
    assert resp.headers["content-type"].startswith("application/json")
    if isinstance(expected, str):  # Elasticsearch's security exception (ElasticsearchException)
        err = resp.json()["error"]
        assert err["type"] == expected and err["root_cause"][0]["type"] == expected
        assert resp.json()["status"] == 401
    else:
        assert resp.json() == expected


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/health", "/ping", "/metrics"])
async def test_health_and_metrics_stay_open(path: str) -> None:
    resp = await ask("GET", path, None, {})
    assert resp.status_code != 401


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/v1/models", "/info"])
async def test_the_right_key_opens_status_routes(path: str) -> None:
    for headers in ({"authorization": "Bearer k1"}, {"x-api-key": "k1"}):
        assert (await ask("GET", path, None, headers)).status_code == 200
