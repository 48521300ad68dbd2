"""A missing or wrong API key, on every protected route, answers 401 in the error body of that
route's protocol; health and metrics stay open (SPEC.md `server.api_keys`; issue 12)."""

from __future__ import annotations

import hmac
from typing import Any

import httpx
import pytest
import respx

from gateway import config, serving
from schemas import errors
from tests.fakes import hosts
from tests.unit.test_pipeline_respx import call

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


@pytest.mark.parametrize("headers", [{"authorization": "Bearer k1"}, {"x-api-key": "k3"},
                                     {"authorization": "Bearer k1x"}, {}],
                         ids=["first-key", "last-key", "prefix", "none"])
def test_every_key_is_compared_in_constant_time_with_no_early_exit(
        monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]) -> None:
    """Python's `==` and a set lookup stop at the first differing byte, which lets response
    timing reveal how much of a key was guessed; `hmac.compare_digest` does not (Python docs,
    hmac.compare_digest). Each key is compared with both headers whichever matched, so the
    time taken does not tell which key (or whether any) matched."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counted(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counted)
    keys = (b"k1", b"k2", b"k3")
    try:
        serving.check_key(keys, headers)
        allowed = True
    except errors.Unauthorized:
        allowed = False
    assert allowed == (headers.get("authorization") == "Bearer k1" or "x-api-key" in headers)
    assert sorted(b for _, b in calls) == sorted(keys * 2)


def test_a_key_is_matched_as_the_clients_bytes() -> None:
    """A key outside ASCII: the client's UTF-8 bytes (read as latin-1 by the server) match the
    configured text's UTF-8."""
    key = "clé-✓"
    sent = key.encode().decode("latin-1")
    serving.check_key((key.encode(),), {"x-api-key": sent})
    with pytest.raises(errors.Unauthorized):
        serving.check_key((key.encode(),), {"x-api-key": "cle-?"})


@pytest.mark.parametrize("keys", [[""], ["k1", ""], [" k1"], ["k1\t"]])
def test_an_empty_or_blank_edged_key_is_a_config_error(keys: list[str]) -> None:
    """An empty key would admit a request that sends no key at all (a missing header reads
    as ""), so `server.api_keys: [""]` must not start a gateway that is silently open."""
    with pytest.raises(ValueError, match="api_keys"):
        config.Config.model_validate({"server": {"api_keys": keys}})


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["vllm", "trtllm", "triton", "tgi", "openai"])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/generate"])
async def test_the_clients_key_never_reaches_a_worker(backend: str, route: str) -> None:
    """SPEC.md: `server.api_keys` guard the gateway's own routes; nothing says a client's key
    is passed on, and a worker of one team must not learn another's key. Neither header, nor
    the key under any other name, is in a request to any kind of worker."""
    cfg = config.Config.model_validate({
        "server": {"api_keys": ["k1-secret"]}, "default_model": "m",
        "models": [{"name": "m", "backend": backend, "upstreams": ["http://w:8000"],
                    "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"
                    if backend == "triton" else None}]})
    seen: list[httpx.Request] = []

    def worker(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503)

    with respx.mock(assert_all_called=False) as r:
        r.route(host="w").mock(side_effect=worker)
        body = ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                if route.startswith("/v1") else {"inputs": "hi"})
        resp = await call(r, body, cfg, {"authorization": "Bearer k1-secret",
                                         "x-api-key": "k1-secret"}, route)
    assert resp.status_code >= 500 and b"k1-secret" not in resp.content
    posts = [q for q in seen if q.method == "POST"]
    assert posts
    for q in posts:
        assert "authorization" not in q.headers and "x-api-key" not in q.headers
        assert b"k1-secret" not in b"".join(f"{k}{v}".encode() for k, v in q.headers.items())
        assert b"k1-secret" not in q.content
