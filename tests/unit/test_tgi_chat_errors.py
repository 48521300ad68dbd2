"""TGI's Messages API as the gateway answers TGI's clients (model `tgi`, `dummy` or none): a
request is checked as TGI checks it, and refused in TGI's form.

Sources, TGI @ db931fcf (v3.3.7): router/src/lib.rs `ChatRequest::try_into_generate` (temperature
0 is greedy and no temperature; `repetition_penalty` = presence_penalty + 2.0; max_tokens is
`max_new_tokens`; top_logprobs is `top_n_tokens`), router/src/server.rs `chat_completions` (the
GenerateRequest goes to generate_internal, whose errors answer `(StatusCode, Json<ErrorResponse>)`,
or to generate_stream_internal, which checks inside the stream: `Err(err) => yield
Ok(err.into_openai_event())`, then `Event::default().data("[DONE]")`), router/src/validation.rs
`Validation::validate` (the checks and their `ValidationError` messages), router/src/infer/mod.rs
(`InferError::ValidationError`'s "Input validation error: " prefix, `into_openai_event`:
`{"error":{"message","http_status_code":422}}`), server.rs `From<InferError>` (validation: 422).
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from adapters import base
from adapters.backends import tgi as tgi_backend
from adapters.backends import vllm
from adapters.frontends import tgi_chat, tgi_encode
from schemas import errors
from tests.unit.test_pipeline_respx import call

MSG = [{"role": "user", "content": "What is Deep Learning?"}]
TARGET = base.Target("http://worker:8000", "org/m")
CHAT = r"http://up[12]:8000/v1/chat/completions"


def refusal(body: dict[str, Any]) -> errors.RequestError:
    with pytest.raises(errors.RequestError) as info:
        tgi_chat.chat_request({"model": "tgi", "messages": MSG, **body})
    return info.value


@pytest.mark.parametrize(("body", "message"), [
    ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),  # OpenAI takes 1.0, TGI does not
    ({"top_p": 0}, "`top_p` must be > 0.0 and < 1.0"),
    ({"temperature": -0.5}, "`temperature` must be strictly positive"),
    ({"max_tokens": 0}, "`max_new_tokens` must be strictly positive"),
    ({"max_completion_tokens": 0}, "`max_new_tokens` must be strictly positive"),
    ({"presence_penalty": -2.0}, "`repetition_penalty` must be strictly positive"),
    ({"frequency_penalty": 2.5}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5"),
    ({"logprobs": True, "top_logprobs": 6}, "`top_n_tokens` must be >= 0 and <= 5. Given: 6"),
])
def test_tgis_checks_and_messages(body: dict[str, Any], message: str) -> None:
    """validation.rs `validate` on the GenerateRequest try_into_generate makes."""
    assert refusal(body).message == message


def test_what_tgi_takes_beyond_openais_ranges_is_taken() -> None:
    """validation.rs has no upper bound on temperature, and presence_penalty 3 is a
    repetition_penalty of 5; temperature 0 is greedy (try_into_generate)."""
    req = tgi_chat.chat_request({"messages": MSG, "temperature": 2.5, "presence_penalty": 3})
    assert (req.sampling.temperature, req.sampling.repetition_penalty) == (2.5, 5.0)
    assert req.sampling.presence_penalty is None


@pytest.mark.parametrize("presence", [-1.5, 0, 0.1, 0.5, 2])
def test_a_tgi_clients_presence_penalty_is_tgis_repetition_penalty(presence: float) -> None:
    """TGI's chat API means `repetition_penalty = presence_penalty + 2.0` (lib.rs
    try_into_generate): a TGI client's presence_penalty is that repetition penalty to every
    worker (vLLM's `repetition_penalty`, the same multiplicative penalty), and exactly its own
    value again to a TGI worker's chat API."""
    req = tgi_chat.chat_request({"messages": MSG, "presence_penalty": presence})
    assert req.sampling.repetition_penalty == presence + 2.0
    assert req.sampling.presence_penalty is None
    assert vllm.VllmBackend().build(req, TARGET).body.count(b'"repetition_penalty":') == 1
    body = orjson.loads(tgi_backend.TgiBackend().build(req, TARGET).body)
    assert body["presence_penalty"] == presence and "repetition_penalty" not in body
    assert tgi_chat.chat_request({"messages": MSG, "temperature": 0}).sampling.temperature == 0


@pytest.mark.parametrize("value", [[], {}, [1.0]])
def test_a_presence_penalty_tgi_would_not_read_is_refused_not_a_bug(value: object) -> None:
    """A presence_penalty that is no number is left to the OpenAI reading, which refuses it
    (hypothesis found `[]` taken as TGI's wider range and passed to float(): a TypeError)."""
    with pytest.raises(errors.InvalidRequest):
        tgi_chat.chat_request({"messages": MSG, "presence_penalty": value})


def test_a_refusal_is_tgis_422_error_response() -> None:
    """server.rs chat_completions without streaming: `generate_internal(...).await?` answers
    the InferError's (422, ErrorResponse)."""
    r = tgi_chat.refusal(refusal({"top_p": 1.0}))
    assert r is not None and (r.status, r.media_type) == (422, "application/json")
    assert r.body == (b'{"error":"Input validation error: `top_p` must be > 0.0 and < 1.0",'
                      b'"error_type":"validation"}')


def test_a_streaming_refusal_is_an_event_after_http_200_then_done() -> None:
    """server.rs chat_completions with streaming: generate_stream_internal yields the
    validation error inside the stream, answered by `into_openai_event` and `[DONE]`."""
    r = tgi_chat.refusal(refusal({"top_p": 1.0, "stream": True}))
    assert r is not None and (r.status, r.media_type) == (200, "text/event-stream")
    assert r.body == (b'data: {"error":{"message":"Input validation error: `top_p` must be > 0.0'
                      b' and < 1.0","http_status_code":422}}\n\ndata: [DONE]\n\n')


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("body", "message"), [
    ({"tools": TOOLS, "tool_choice": "get_time"}, "Tool with name get_time not found"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "auto"}}},
     "Tool with name auto not found"),
    ({"tools": [], "tool_choice": "get_weather"}, "Tool with name get_weather not found"),
    # checked before the generate request is validated: top_p 1.0 is not what is reported
    ({"tools": TOOLS, "tool_choice": "get_time", "top_p": 1.0},
     "Tool with name get_time not found"),
    ({"tools": TOOLS, "response_format": {"type": "json", "value": {}}},
     "Grammar and tools are mutually exclusive"),
])
def test_a_tool_error_is_tgis_422_before_any_stream(body: dict[str, Any], message: str,
                                                     stream: bool) -> None:
    """lib.rs `try_into_generate` (ToolGrammar::apply, infer/tool_grammar.rs
    `find_tool_by_name`: "Tool with name {} not found"; "Grammar and tools are mutually
    exclusive") runs in server.rs chat_completions before the stream starts, and its `?`
    answers `From<InferError>`: ToolError is 422, error_type `tool_error`, Display "Tool
    error: {0}" (infer/mod.rs), streaming or not."""
    r = tgi_chat.refusal(refusal({**body, "stream": stream}))
    assert r is not None and (r.status, r.media_type) == (422, "application/json")
    assert r.body == orjson.dumps({"error": f"Tool error: {message}", "error_type": "tool_error"})


@pytest.mark.parametrize("choice", ["get_weather", "auto", "none", "required",
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_a_tool_choice_tgi_finds_is_taken(choice: object) -> None:
    req = tgi_chat.chat_request({"messages": MSG, "tools": TOOLS, "tool_choice": choice})
    assert [t.name for t in req.tools] == ["get_weather"]


@pytest.mark.anyio
async def test_a_streaming_tool_error_through_the_app() -> None:
    with respx.mock(assert_all_called=False) as r:
        resp = await call(r, {"model": "tgi", "messages": MSG, "stream": True, "tools": TOOLS,
                              "tool_choice": "nope"})
    assert resp.status_code == 422
    assert resp.json() == {"error": "Tool error: Tool with name nope not found",
                           "error_type": "tool_error"}


@pytest.mark.parametrize("answer", [
    lambda exc: tgi_chat.render_error(exc, stream=True),
    lambda exc: tgi_encode.render_error(exc, in_stream=True),
])
def test_an_error_in_a_tgi_stream_has_the_heads_of_a_tgi_stream(answer: Any) -> None:
    """TGI answers a stream's error as an event of its SSE response (server.rs
    generate_stream, chat_completions: `(headers, Sse::new(stream))`), so the head is an
    axum Sse one: `content-type: text/event-stream` and `cache-control: no-cache` (axum
    response/sse.rs `IntoResponse for Sse`), with TGI's `x-accel-buffering: no`."""
    r = answer(errors.InvalidRequest("`top_p` must be > 0.0 and < 1.0", field="top_p"))
    assert (r.status, r.media_type) == (200, "text/event-stream")
    assert r.headers == {"cache-control": "no-cache", "x-accel-buffering": "no"}


def test_only_refusals_of_tgi_chat_requests_are_rendered_so() -> None:
    assert tgi_chat.refusal(errors.InvalidRequest("`top_p` bad", field="top_p")) is None


@pytest.mark.anyio
async def test_a_refused_tgi_chat_request_through_the_app() -> None:
    with respx.mock(assert_all_called=False) as r:
        resp = await call(r, {"model": "tgi", "messages": MSG, "top_p": 1.0})
    assert resp.status_code == 422
    assert resp.json() == {"error": "Input validation error: `top_p` must be > 0.0 and < 1.0",
                           "error_type": "validation"}


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_worker_refusal_is_answered_in_tgis_form(stream: bool) -> None:
    """After parsing, the translator answers: a worker's 400 before the first byte is TGI's
    validation error, 422 (server.rs From<InferError>), or in a stream the event and
    `[DONE]` after HTTP 200 (server.rs chat_completions, infer/mod.rs into_openai_event)."""
    refused = {"error": {"message": "`max_tokens` is too large", "type": "BadRequestError",
                         "param": None, "code": 400}}
    with respx.mock() as r:
        r.post(url__regex=CHAT).mock(return_value=httpx.Response(400, json=refused))
        resp = await call(r, {"model": "dummy", "messages": MSG, "stream": stream})
    message = "Input validation error: `max_tokens` is too large"
    if not stream:
        assert resp.status_code == 422
        assert resp.content == orjson.dumps({"error": message, "error_type": "validation"})
        return
    assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
    assert resp.content == (b"data: " + orjson.dumps({"error": {
        "message": message, "http_status_code": 422}}) + b"\n\ndata: [DONE]\n\n")
