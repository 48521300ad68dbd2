"""Client input that error bodies and log lines quote (model names, path parameters) stays
bounded and valid JSON in every protocol, whatever its bytes: a client's 1 MB model name is
not echoed back whole, and control characters cannot forge a log line (SPEC.md, Behaviour
under load, faults and bad input: 404 in the protocol's own error body)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from structlog.testing import capture_logs

from gateway import config
from schemas import errors
from tests.fakes import hosts

CFG = config.Config.model_validate({
    "default_model": "m", "models": [{"name": "m", "upstreams": ["http://w:8000"]}]})
HUGE = "m" * 1_000_000
CHAT = [{"role": "user", "content": "hi"}]
CODED = HUGE[:5000]  # path parameters: the URL, not the body, carries them

# (path, body): each names a model that does not exist
CASES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"model": HUGE, "messages": CHAT}),
    ("/v1/completions", {"model": HUGE, "prompt": "hi"}),
    (f"/predictions/{CODED}", {"inputs": "hi"}),
    (f"/_inference/completion/{CODED}", {"input": "hi"}),
    (f"/_inference/chat_completion/{CODED}/_stream", {"messages": CHAT}),
    (f"/v1/models/{CODED}", {}),
]


async def ask(path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]]]:
    with capture_logs() as logs:
        async with hosts.serve(CFG, {}) as client:
            method = "GET" if path.startswith("/v1/models") else "POST"
            resp = await client.request(method, path, json=body or None)
    return resp, logs


def error_json(resp: httpx.Response) -> Any:
    """The error body as JSON (an Elastic stream's `event: error` data line too)."""
    text = resp.text
    if text.startswith("event: error\n"):
        text = text.split("data: ", 1)[1].removesuffix("\n\n")
    assert "\n" not in text and "\r" not in text  # one line: nothing forged after it
    return json.loads(text)


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body"), CASES, ids=[c[0][:24] for c in CASES])
async def test_a_huge_unknown_model_name_is_a_bounded_404(path: str, body: dict[str, Any]) -> None:
    resp, logs = await ask(path, body)
    assert resp.status_code == 404
    assert len(resp.content) < 4 * errors.MAX_TEXT, len(resp.content)
    assert "mmmmmmmm" in json.dumps(error_json(resp))  # still says which name it was
    # the log line: the message bounded; a path is at most the server's 8 KiB request target
    assert all(len(repr(e)) < 16 * 1024 for e in logs)


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["a\nb\r\x00\x1b[31m\u2028\"}", "\ud800x", "é/../m"],
                         ids=["controls", "lone-surrogate", "traversal"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/_inference/chat_completion/m/_unified"])
async def test_control_characters_in_a_model_name_stay_escaped(name: str, path: str) -> None:
    """Quoted back as JSON escapes (RFC 8259 section 7), never raw line breaks; a lone
    surrogate, which UTF-8 cannot carry, is a 400 about the body, not a 500."""
    with capture_logs():
        async with hosts.serve(CFG, {}) as client:
            raw = json.dumps({"model": name, "messages": CHAT}).encode()
            if path.startswith("/_inference"):  # the model is the path's: the name in the body
                path = path.replace("/m/", f"/{quote(name, safe='', errors='surrogatepass')}/")
                raw = json.dumps({"messages": CHAT}).encode()
            resp = await client.post(path, content=raw,
                                     headers={"content-type": "application/json"})
    assert resp.status_code in (400, 404, 424)
    error_json(resp)


def test_bounded_keeps_both_ends() -> None:
    text = "The model `" + "x" * 5000 + "` does not exist."
    out = errors.bounded(text)
    assert len(out) <= errors.MAX_TEXT
    assert out.startswith("The model `x") and out.endswith("` does not exist.")
    assert errors.bounded("short") == "short"
