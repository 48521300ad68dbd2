"""Worker failures before the first byte, as each client protocol answers them (issue 12):
nothing internal (addresses, exception classes, a proxy's HTML page) reaches the client, which
reads a stable message while the request's log line keeps the detail; LMI answers
`{"error", "code"}` with the worker's message; permanent failures are tried once."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import respx

from adapters import base
from gateway import upstream, upstream_clients
from schemas import errors
from tests import leaks
from tests.unit.test_pipeline_respx import call, make_config

HTML = b"<html><body><h1>502 Bad Gateway</h1><hr>nginx/1.25 at 10.0.3.7:8000</body></html>"
LEAKY_CONNECT = httpx.ConnectError("ClientConnectorError: Cannot connect to host 127.0.0.1:1")

# (path, body, where the client's message is in the answer) per client protocol. Each answer is
# bounded small (a limit of 16 tokens, or LMI's and completions' defaults), so the worker is
# asked for one JSON body (gateway.whole), whose malformation one test here is about.
CLIENTS: list[tuple[str, dict[str, Any], Any]] = [
    ("/v1/chat/completions", {"model": "demo", "messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 16}, lambda b: b["error"]["message"]),
    ("/v1/completions", {"model": "demo", "prompt": "Hi"}, lambda b: b["error"]["message"]),
    # TGI prefixes its InferError text (server.rs: "Request failed during generation: ...").
    ("/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 16}},
     lambda b: b["error"].removeprefix("Request failed during generation: ")),
    ("/invocations", {"inputs": "Hi"}, lambda b: b["error"]),
    ("/invocations", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16},
     lambda b: b["error"]),
    ("/invocations", {"prompt": "Hi"}, lambda b: b["error"]),
    ("/_inference/completion/demo", {"input": "Hi", "task_settings": {"max_tokens": 16}},
     lambda b: b["error"]["reason"]),
]
IDS = ["openai-chat", "openai-completions", "tgi", "lmi-inputs", "lmi-chat", "lmi-prompt",
       "elastic"]


async def answer(side_effect: Any, path: str, body: dict[str, Any]) -> tuple[httpx.Response,
                                                                              respx.Route]:
    with respx.mock(assert_all_called=False) as r:
        route = r.post(url__startswith="http://up").mock(side_effect=side_effect)
        resp = await call(r, body, path=path, headers={"x-request-id": "rid-42"})
    return resp, route


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body", "message"), CLIENTS, ids=IDS)
async def test_unreachable_workers_get_a_stable_message(
        path: str, body: dict[str, Any], message: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    resp, _ = await answer(LEAKY_CONNECT, path, body)
    assert resp.status_code == 503
    assert message(resp.json()) == upstream.UNREACHABLE
    assert leaks.scan(resp.content) == []
    log = capsys.readouterr().out
    assert "rid-42" in log and "ClientConnectorError" in log and "127.0.0.1:1" in log


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body", "message"), CLIENTS, ids=IDS)
async def test_a_proxys_html_page_stays_in_the_log(
        path: str, body: dict[str, Any], message: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    page = httpx.Response(502, content=HTML, headers={"content-type": "text/html"})
    resp, _ = await answer(page, path, body)
    assert resp.status_code == 502
    assert message(resp.json()) == "the worker answered HTTP 502"
    assert leaks.scan(resp.content) == []
    assert "502 Bad Gateway" in capsys.readouterr().out


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body", "message"), CLIENTS, ids=IDS)
async def test_a_malformed_worker_body_is_not_echoed(
        path: str, body: dict[str, Any], message: Any) -> None:
    garbage = httpx.Response(200, content=b"{not json from 10.0.0.9:8000",
                             headers={"content-type": "application/json"})
    resp, _ = await answer(garbage, path, body)
    assert resp.status_code == 502
    assert message(resp.json()) == "the worker sent malformed JSON"
    assert leaks.scan(resp.content) == []


def test_the_leak_scanner_finds_what_main_used_to_answer() -> None:
    """The check the suite applies to every error answer (tests/conftest.py) is real."""
    old = (b'{"error":{"message":"the worker could not be reached (ClientConnectorError: '
           b'Cannot connect to host 127.0.0.1:1 ssl:default)"}}')
    assert set(leaks.scan(old)) >= {"loopback address", "exception class name"}
    assert leaks.scan(HTML) == ["address with a port", "HTML page"]
    assert leaks.scan(b'{"error":"worker at http://vllm-0.vllm:8000 failed"}') == [
        "address with a port"]
    assert leaks.scan(b'{"error":"`max_tokens` must be <= 4096","code":424}') == []
    seen = leaks.Collector()
    request = httpx.Request("POST", "http://gw/generate")
    seen.check(request, httpx.Response(502, content=old))
    seen.check(request, httpx.Response(200, content=b'{"generated_text":"127.0.0.1"}'))
    assert len(seen.found) == 1 and "/generate -> 502" in seen.found[0]


# ---- LMI: the worker's message in {"error", "code"}, every schema ----

LMI_BODIES = [{"inputs": "Hi"}, {"inputs": "Hi", "parameters": {"details": True}},
              {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16},
              {"prompt": "Hi"}]


@pytest.mark.anyio
@pytest.mark.parametrize("body", LMI_BODIES, ids=["inputs", "details", "chat", "prompt"])
@pytest.mark.parametrize(("status", "code"), [(400, 424), (422, 424), (404, 404),
                                              (500, 502), (503, 503)])
async def test_lmi_worker_errors_keep_the_workers_message(
        body: dict[str, Any], status: int, code: int) -> None:
    refusal = httpx.Response(status, json={"error": {"message": "prompt is too long",
                                                     "type": "BadRequestError", "code": status}})
    resp, _ = await answer(refusal, "/invocations", body)
    assert resp.status_code == code
    assert resp.json() == {"error": "prompt is too long", "code": code}


@pytest.mark.anyio
@pytest.mark.parametrize("body", LMI_BODIES, ids=["inputs", "details", "chat", "prompt"])
async def test_lmi_malformed_worker_body(body: dict[str, Any]) -> None:
    resp, _ = await answer(httpx.Response(200, content=b"[1, 2"), "/invocations", body)
    assert resp.status_code == 502
    assert resp.json() == {"error": "the worker sent malformed JSON", "code": 502}


# ---- permanent failures: one attempt ----

@pytest.mark.anyio
@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
async def test_a_worker_4xx_is_tried_once(status: int) -> None:
    refusal = httpx.Response(status, json={"error": {"message": "no"}})
    resp, route = await answer(refusal, "/v1/completions", {"model": "demo", "prompt": "Hi"})
    assert resp.status_code == status and route.call_count == 1


@pytest.mark.anyio
async def test_an_unusable_url_is_tried_once_with_a_clear_error() -> None:
    resp, route = await answer(httpx.UnsupportedProtocol("Request URL has an unsupported "
                                                         "protocol 'htp://'"),
                               "/v1/completions", {"model": "demo", "prompt": "Hi"})
    assert route.call_count == 1
    assert resp.status_code == 502
    assert resp.json()["error"]["message"] == upstream.BAD_URL


@pytest.mark.anyio
async def test_aiohttp_invalid_url_is_permanent() -> None:
    client = upstream_clients.AiohttpClient(1.0)
    try:
        with pytest.raises(errors.UpstreamError) as err:
            await client.send(base.UpstreamRequest("POST", "http://[bad", b"{}", {}, False))
    finally:
        await client.aclose()
    assert not isinstance(err.value, errors.UpstreamUnavailable)
    assert err.value.message == upstream.BAD_URL and "InvalidUrl" in (err.value.detail or "")


@pytest.mark.anyio
async def test_a_retryable_failure_is_tried_again() -> None:
    """The counts above are real: a worker that is down is tried 1 + `retries` times."""
    _, route = await answer(LEAKY_CONNECT, "/v1/completions", {"model": "demo", "prompt": "Hi"})
    assert route.call_count == 1 + make_config().server.retries


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body", "message"), CLIENTS, ids=IDS)
@pytest.mark.parametrize("status", [401, 403])
async def test_a_worker_refusing_access_answers_in_each_protocols_body(
        path: str, body: dict[str, Any], message: Any, status: int) -> None:
    """A worker's own 401/403 (a key the gateway holds is wrong) keeps its message, in the
    client's error body, tried once; its status too, but on TGI's routes, whose InferError has
    one status for every refusal (422 validation, tgi_encode.error_parts)."""
    refusal = httpx.Response(status, json={"error": {"message": "worker key rejected"}})
    resp, route = await answer(refusal, path, body)
    assert route.call_count == 1
    assert resp.status_code == (422 if path == "/generate" else status)
    assert message(resp.json()).endswith("worker key rejected")


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body", "message"), CLIENTS, ids=IDS)
async def test_a_worker_4xx_is_logged_as_the_clients_error(
        path: str, body: dict[str, Any], message: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker's 4xx (vLLM: `max_tokens` past the context) reaches the client as a 4xx, and
    the request's log line says `client_error`, as for the gateway's own refusals, not
    `error` (which marks the request's span failed: a client's mistake is not the server's
    error, OpenTelemetry recording-errors)."""
    refusal = httpx.Response(400, json={"error": {"message": "prompt is too long",
                                                  "type": "BadRequestError", "code": 400}})
    resp, _ = await answer(refusal, path, body)
    assert 400 <= resp.status_code < 500
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "] request " in ln]
    assert [re.findall(r" (outcome|error_type)=(\w+)", ln) for ln in lines] == [
        [("error_type", "UpstreamRejected"), ("outcome", "client_error")]]
