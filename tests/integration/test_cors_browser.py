"""A browser's chat page calling a real `gateway serve` process: the CORS preflight, then the
streamed chat completion it allows, as vLLM's API server answers both (Starlette's
CORSMiddleware around the whole app, vllm/entrypoints/openai/api_server.py build_app, with
its defaults: any origin, method and header). Without CORS a page that worked against vLLM
failed behind the gateway: its preflight got a 405 and no answer named the page's origin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration import rawhttp

pytestmark = pytest.mark.integration

SITE = "http://localhost:5173"  # a chat UI's dev server


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[rawhttp.Gateway]:
    gw = rawhttp.start(Path(tmp_path_factory.mktemp("cors")))
    try:
        yield gw
    finally:
        gw.proc.stop()


def test_a_preflight_then_a_streamed_chat(gateway: rawhttp.Gateway) -> None:
    """What `fetch()` does for a JSON POST with a key: the preflight (Fetch standard,
    CORS-preflight request: Origin, Access-Control-Request-Method and -Headers, no key), then
    the request, whose answer the page reads only if it names the origin (or "*")."""
    host, port = gateway.addr
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=20) as client:
        pre = client.options(rawhttp.CHAT, headers={
            "origin": SITE, "access-control-request-method": "POST",
            "access-control-request-headers": "content-type,authorization",
            "x-request-id": "preflight-1"})
        with client.stream("POST", rawhttp.CHAT, content=rawhttp.chat(stream=True),
                           headers={"origin": SITE, "content-type": "application/json",
                                    "authorization": "Bearer anything"}) as resp:
            body = b"".join(resp.iter_bytes())
        other = client.options(rawhttp.CHAT, headers={"origin": SITE})  # no preflight
    assert (pre.status_code, pre.text) == (200, "OK")
    assert pre.headers["access-control-allow-origin"] == "*"
    assert pre.headers["access-control-allow-headers"] == "content-type,authorization"
    assert "POST" in pre.headers["access-control-allow-methods"].split(", ")
    assert pre.headers["x-request-id"] == "preflight-1"
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["access-control-allow-origin"] == "*"
    assert resp.headers["vary"] == "Origin"
    assert body.endswith(b"data: [DONE]\n\n")
    assert other.status_code == 405 and other.headers["allow"] == "POST"
    assert other.headers["access-control-allow-origin"] == "*"
    gateway.requests_logged()  # the lines of the answers just given are all written
    lines = [r for r in gateway.log_records() if r.get("request_id") == "preflight-1"]
    assert [(r["event"], r["status"]) for r in lines] == [("request", 200)]
