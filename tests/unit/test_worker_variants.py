"""Answers of real workers that differ from the happy path, through the whole gateway at the
upstream seam (respx): each client gets the correct answer, or its own protocol's error with
the status a client can act on (a worker's 4xx stays a 4xx, tried once)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from gateway import upstream
from schemas import errors
from tests.unit.test_pipeline_respx import CHAT, SSE_OK, call, healthy, make_config, worker_ok

# vLLM 0.11 serving_chat.py: an exception of the stream's generator is written as one error
# event then `[DONE]`, under HTTP 200; engine/serving.py create_error_response gives a
# ValueError / VLLMValidationError code 400. AsyncLLM.generate calls add_request inside the
# generator (vllm/v1/engine/async_llm.py), so its checks (here `--max-logprobs 5`) fail so.
REFUSAL = (b'data: {"error": {"message": "Requested sample logprobs of 8, which is greater than '
           b'max allowed: 5", "type": "BadRequestError", "param": null, "code": 400}}\n\n'
           b"data: [DONE]\n\n")
MESSAGE = "Requested sample logprobs of 8, which is greater than max allowed: 5"


async def answer(body: bytes, request: dict[str, Any], path: str) -> tuple[httpx.Response, int]:
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        route = r.post(url__startswith="http://up").mock(return_value=httpx.Response(
            200, content=body, headers={"content-type": "text/event-stream; charset=utf-8"}))
        resp = await call(r, request, make_config(failover_attempts=0), path=path)
    return resp, route.call_count


@pytest.mark.anyio
async def test_a_vllm_refusal_in_its_stream_is_the_clients_400_tried_once() -> None:
    """Not a 502 after retries on every worker: the request is at fault, as the worker said."""
    resp, calls = await answer(REFUSAL, {**CHAT, "stream": True, "logprobs": True,
                                         "top_logprobs": 8}, "/v1/chat/completions")
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == MESSAGE
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert calls == 1


@pytest.mark.anyio
async def test_a_vllm_refusal_in_its_stream_reaches_a_tgi_client_as_its_error() -> None:
    resp, calls = await answer(REFUSAL, {"inputs": "Hi", "parameters": {"details": True}},
                               "/generate_stream")
    """TGI's /generate_stream answers every error as an event under HTTP 200 (server.rs
    generate_stream_internal), validation errors too."""
    assert resp.status_code == 200
    assert orjson.loads(resp.text.removeprefix("data: ")) == {
        "error": f"Input validation error: {MESSAGE}", "error_type": "validation"}
    assert calls == 1


@pytest.mark.anyio
async def test_a_vllm_failure_in_its_stream_is_still_a_worker_failure() -> None:
    """A 5xx `code` (an engine error) is the worker's failure: retried, then 502."""
    failure = REFUSAL.replace(b'"code": 400', b'"code": 500').replace(
        b"BadRequestError", b"InternalServerError")
    resp, calls = await answer(failure, {**CHAT, "stream": True}, "/v1/chat/completions")
    assert resp.status_code in (502, 503)
    assert calls > 1


@pytest.mark.anyio
async def test_a_refusal_after_text_ends_the_stream_in_band() -> None:
    head = orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1,
                         "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"},
                                                    "finish_reason": None}]})
    resp, _ = await answer(b"data: " + head + b"\n\n" + REFUSAL, {**CHAT, "stream": True},
                           "/v1/chat/completions")
    assert resp.status_code == 200
    events = [e for e in resp.text.split("\n\n") if e]
    assert '"content":"Hel"' in events[1]
    assert orjson.loads(events[-2].removeprefix("data: "))["error"]["message"] == MESSAGE
    assert events[-1] == "data: [DONE]"


RATE_LIMITED = httpx.Response(429, json={"error": {
    "message": "Rate limit reached for requests", "type": "requests", "param": None,
    "code": "rate_limit_exceeded"}}, headers={"retry-after": "1"})


@pytest.mark.anyio
async def test_a_rate_limited_openai_worker_is_passed_over_for_another() -> None:
    """OpenAI's API answers 429 when a key's rate limit is reached (openai-python
    RateLimitError): that worker is busy, the request is fine, so another upstream takes it."""
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        first = r.post("http://up1:8000/v1/chat/completions").mock(return_value=RATE_LIMITED)
        second = r.post("http://up2:8000/v1/chat/completions").mock(side_effect=worker_ok)
        resp = await call(r, CHAT)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "Hello"
    assert first.call_count == 1 and second.call_count == 1


@pytest.mark.anyio
async def test_every_worker_rate_limited_is_the_clients_429() -> None:
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        r.post(url__startswith="http://up").mock(return_value=RATE_LIMITED)
        resp = await call(r, CHAT)
    assert resp.status_code == 429
    assert resp.json()["error"]["message"] == "Rate limit reached for requests"
    assert resp.headers["retry-after"] == "1"  # the worker's own


@pytest.mark.anyio
async def test_fastapis_own_422_names_the_fields_in_the_clients_message() -> None:
    """An OpenAI-compatible server that leaves validation to FastAPI answers 422
    `{"detail": [{"type", "loc", "msg", "input"}]}` (fastapi/exception_handlers.py); the client
    reads the fields and reasons, not a Python list's repr."""
    body = {"detail": [{"type": "missing", "loc": ["body", "messages"], "msg": "Field required",
                        "input": {}},
                       {"type": "float_parsing", "loc": ["body", "temperature"],
                        "msg": "Input should be a valid number", "input": "hot"}]}
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        route = r.post(url__startswith="http://up").mock(
            return_value=httpx.Response(422, json=body))
        resp = await call(r, CHAT)
    assert resp.status_code == 422 and route.call_count == 1
    assert resp.json()["error"]["message"] == (
        "`messages`: Field required; `temperature`: Input should be a valid number")


@pytest.mark.anyio
async def test_a_stream_answered_with_no_event_at_all_is_tried_on_another_worker() -> None:
    """trtllm-serve's openai_chat returns nothing on a CppExecutorError (it raises SIGINT to
    stop itself; openai_server.py), which FastAPI sends as HTTP 200 `null`: the worker failed
    before anything reached the client, so another upstream takes the stream."""
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        dying = r.post("http://up1:8000/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=b"null", headers={"content-type": "application/json"}))
        good = r.post("http://up2:8000/v1/chat/completions").mock(
            return_value=httpx.Response(200, content=SSE_OK))
        resp = await call(r, {**CHAT, "stream": True})
    assert resp.status_code == 200 and '"content":"Hello"' in resp.text
    assert resp.text.endswith("data: [DONE]\n\n")
    assert dying.call_count == 1 and good.call_count == 1


@pytest.mark.parametrize(("status", "given", "passed_on"), [
    (429, "7", "7"), (503, "120", "120"),
    (429, "Wed, 21 Oct 2026 07:28:00 GMT", "Wed, 21 Oct 2026 07:28:00 GMT"),
    (429, "soon", None), (429, "1" * 11, None), (400, "7", None)])
def test_only_a_well_formed_retry_after_of_a_429_or_503_is_passed_on(
        status: int, given: str, passed_on: str | None) -> None:
    """RFC 9110 section 10.2.3: delta-seconds or an HTTP date; a refusal of the request
    itself (a 400) says nothing of when to come back."""
    exc = upstream.with_retry_after(errors.UpstreamUnavailable("busy", status=status), given)
    assert exc.retry_after == passed_on
