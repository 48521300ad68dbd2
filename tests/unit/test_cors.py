"""gateway.cors against its oracle: Starlette's CORSMiddleware (starlette/middleware/cors.py,
`preflight_response`, `send`) run on a stub app, for a table of settings and requests. vLLM's
API server answers browsers with that middleware (vllm/entrypoints/openai/api_server.py
build_app; defaults from vllm/entrypoints/openai/cli_args.py FrontendArgs: allowed_origins,
allowed_methods, allowed_headers ["*"], allow_credentials False), so the gateway's own server
must give the same status, body and CORS fields for each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.middleware.cors import CORSMiddleware

from gateway import config, cors

SITE = "https://chat.example"
OTHER = "https://evil.example"

SETTINGS: dict[str, dict[str, Any]] = {
    "vllm_defaults": {},
    "credentials_with_star": {"allow_credentials": True},
    "listed": {"allow_origins": [SITE], "allow_methods": ["POST"],
               "allow_headers": ["Authorization", "X-Request-Id"], "max_age": 60},
    "listed_credentials_exposed": {"allow_origins": [SITE, "http://localhost:3000"],
                                   "allow_credentials": True,
                                   "expose_headers": ["x-request-id"]},
    "regex": {"allow_origins": [], "allow_origin_regex": r"https://.*\.example",
              "allow_private_network": True},
    "star_with_expose": {"expose_headers": ["x-request-id", "retry-after"]},
}

REQUESTS: dict[str, tuple[str, dict[str, str]]] = {
    "no_origin": ("POST", {}),
    "site": ("POST", {"origin": SITE}),
    "other": ("POST", {"origin": OTHER}),
    "localhost": ("GET", {"origin": "http://localhost:3000"}),
    "preflight_plain": ("OPTIONS", {"origin": SITE, "access-control-request-method": "POST"}),
    "preflight_headers": ("OPTIONS", {
        "origin": SITE, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type, X-Request-Id"}),
    "preflight_unlisted_header": ("OPTIONS", {
        "origin": SITE, "access-control-request-method": "POST",
        "access-control-request-headers": "x-stainless-os"}),
    "preflight_other_origin": ("OPTIONS", {"origin": OTHER,
                                           "access-control-request-method": "POST"}),
    "preflight_put": ("OPTIONS", {"origin": SITE, "access-control-request-method": "PUT"}),
    "preflight_private_network": ("OPTIONS", {
        "origin": SITE, "access-control-request-method": "POST",
        "access-control-request-private-network": "true"}),
}


def _cors_fields(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The fields CORS is about; repeated ones joined as one list (RFC 9110 section 5.3)."""
    out: dict[str, list[str]] = {}
    for k, v in headers:
        name = k.decode("latin-1").lower()
        if name.startswith("access-control-") or name == "vary":
            out.setdefault(name, []).append(v.decode("latin-1"))
    return {k: ", ".join(v) for k, v in out.items()}


def _starlette(settings: dict[str, Any], method: str, headers: dict[str, str]
               ) -> tuple[int, dict[str, str], bytes]:
    """The middleware's answer, around an app that answers 200 as a gateway route does."""

    async def stub(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"x-request-id", b"r1")]})
        await send({"type": "http.response.body", "body": b"{}"})

    cfg = config.CorsConfig.model_validate(settings)
    mw = CORSMiddleware(stub, allow_origins=cfg.allow_origins, allow_methods=cfg.allow_methods,
                        allow_headers=cfg.allow_headers, allow_credentials=cfg.allow_credentials,
                        allow_origin_regex=cfg.allow_origin_regex,
                        allow_private_network=cfg.allow_private_network,
                        expose_headers=cfg.expose_headers, max_age=cfg.max_age)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/v1/chat/completions",
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(mw(scope, receive, send))
    return sent[0]["status"], _cors_fields(sent[0]["headers"]), sent[1]["body"]


def _ours(settings: dict[str, Any], method: str, headers: dict[str, str]
          ) -> tuple[int, dict[str, str], bytes]:
    policy = cors.policy(config.CorsConfig.model_validate(settings))
    assert policy is not None
    if "origin" in headers and method == "OPTIONS" \
            and "access-control-request-method" in headers:
        status, fields, body = policy.preflight(headers)
        return status, _cors_fields([(k.encode(), v.encode()) for k, v in fields]), body
    lines = policy.simple(headers["origin"]) if "origin" in headers else policy.vary
    parsed = [tuple(line.split(b": ", 1)) for line in lines.split(b"\r\n") if line]
    return 200, _cors_fields(parsed), b"{}"  # type: ignore[arg-type]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("request_", REQUESTS)
def test_the_answer_is_starlettes(settings: str, request_: str) -> None:
    """Status, body and every CORS field (`access-control-*`, `vary`) as Starlette's
    CORSMiddleware gives them: the preflight's 200 `OK` or 400 `Disallowed CORS ...`, `vary:
    Origin` on every other answer (Starlette PR #3516: caches must tell an answer with no
    allow-origin from one with it), the origin named back with credentials instead of "*",
    nothing but `vary` (and credentials/expose) for an origin not allowed."""
    method, headers = REQUESTS[request_]
    assert _ours(SETTINGS[settings], method, headers) == \
        _starlette(SETTINGS[settings], method, headers)


def test_the_defaults_are_vllms() -> None:
    """vllm/entrypoints/openai/cli_args.py FrontendArgs: allow_credentials False,
    allowed_origins / allowed_methods / allowed_headers ["*"]; Starlette's max_age 600."""
    cfg = config.Config.model_validate({}).server.cors
    assert (cfg.allow_origins, cfg.allow_methods, cfg.allow_headers, cfg.allow_credentials,
            cfg.max_age) == (("*",), ("*",), ("*",), False, 600)
    assert cors.policy(cfg) is not None


def test_no_origin_turns_cors_off() -> None:
    off = config.CorsConfig.model_validate({"allow_origins": []})
    assert cors.policy(off) is None
    assert cors.policy(off.model_copy(update={"allow_origin_regex": "https://a"})) is not None


def test_a_pattern_that_does_not_compile_is_a_config_error(tmp_path: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("server: {cors: {allow_origin_regex: 'https://(a'}}\n")
    with pytest.raises(config.ConfigError) as err:
        config.load_config(path, {})
    assert err.value.problems[0].startswith(
        "server.cors.allow_origin_regex: not a regular expression")


def test_origins_from_the_environment() -> None:
    """A Kubernetes manifest sets the origins without a config file: `a,b`, or `[]` (off)."""
    cfg = config.load_config(None, {"GATEWAY_SERVER__CORS__ALLOW_ORIGINS":
                                    "https://a.example,https://b.example"})
    assert cfg.server.cors.allow_origins == ("https://a.example", "https://b.example")
    off = config.load_config(None, {"GATEWAY_SERVER__CORS__ALLOW_ORIGINS": "[]"})
    assert cors.policy(off.server.cors) is None
