"""The LMI routes through the real app, with respx-mocked vLLM workers: the translated upstream
request, prefill decoded from vLLM's `prompt_logprobs`, streams framed per model, errors before
the first byte (seed 003's bodies and statuses) and after it (seed 003's error line), workers
that cannot give token ids, /predictions/{model}, /ping.

Worker bytes follow vLLM 0.11 `serving_completion.py` (wire-formats.md 3.2 and 3.4;
prompt_logprobs: null first, then {"<id>": {"logprob", "rank", "decoded_token"}}).
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from gateway import config
from tests.unit.test_pipeline_respx import UP1, UP2, Broken, call
from tests.unit.test_tgi_respx import get

COMPLETIONS = r"http://up[12]:8000/v1/completions"
CHAT = r"http://up[12]:8000/v1/chat/completions"
SSE = {"content-type": "text/event-stream"}
PROMPT = "What is Deep Learning?"


def cfg(**models: dict[str, Any]) -> config.Config:
    """`demo` (default, vLLM) plus named models with their own settings."""
    entries = [{"name": "demo", "backend": "vllm", "upstreams": [UP1, UP2], "routing": "round_robin",
                "upstream_model": "org/model"}]
    entries += [{"name": name, "upstreams": [UP1], **m} for name, m in models.items()]
    return config.Config.model_validate({"default_model": "demo", "models": entries})


def chunk(text: str, tid: int, lp: float, finish: str | None = None, offset: int = 0) -> bytes:
    choice = {"index": 0, "text": text,
              "logprobs": {"text_offset": [offset], "token_logprobs": [lp], "tokens": [text],
                           "top_logprobs": [{text: lp}]},
              "finish_reason": finish, "stop_reason": None, "prompt_token_ids": None,
              "token_ids": [tid]}
    body = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [choice], "usage": None}
    return b"data: " + orjson.dumps(body) + b"\n\n"


USAGE = (b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],'
         b'"usage":{"prompt_tokens":6,"total_tokens":8,"completion_tokens":2}}\n\n')
STREAM = chunk("Deep", 304, -0.05) + chunk(" Learning", 11157, -1.25, "length", 4) + USAGE + \
    b"data: [DONE]\n\n"
WHOLE = orjson.dumps({
    "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "text": "Deep Learning",
                 "logprobs": {"text_offset": [0, 4], "token_logprobs": [-0.05, -1.25],
                              "tokens": ["Deep", " Learning"],
                              "top_logprobs": [{"Deep": -0.05}, {" Learning": -1.25}]},
                 "finish_reason": "length", "stop_reason": None, "token_ids": [304, 11157],
                 "prompt_logprobs": [None, {"1724": {"logprob": -7.868, "rank": 3,
                                                    "decoded_token": "What"},
                                            "450": {"logprob": -1.2, "rank": 1,
                                                    "decoded_token": "The"}},
                                     {"338": {"logprob": -1.25, "rank": 1,
                                              "decoded_token": " is"}}],
                 "prompt_token_ids": [1, 1724, 338]}],
    "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}})


@pytest.mark.anyio
async def test_inputs_with_details_and_prefill_end_to_end() -> None:
    body = {"inputs": PROMPT, "parameters": {"details": True, "decoder_input_details": True,
                                             "max_new_tokens": 2, "stop_sequences": ["\n"]}}
    with respx.mock() as r:
        route = r.post(url__regex=COMPLETIONS).mock(return_value=httpx.Response(200, content=WHOLE))
        resp = await call(r, body, cfg(), path="/invocations")
    sent = orjson.loads(route.calls.last.request.content)
    assert sent["model"] == "org/model" and sent["prompt"] == PROMPT
    assert (sent["max_tokens"], sent["stop"], sent["temperature"]) == (2, ["\n"], 0.0)
    assert sent["return_token_ids"] is True and sent["logprobs"] == 0
    assert sent["prompt_logprobs"] == 1
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    assert resp.content == (
        b'{"generated_text": "Deep Learning", "details": {"finish_reason": "length", '
        b'"generated_tokens": 2, "inputs": "What is Deep Learning?", "tokens": [{"id": 304, '
        b'"text": "Deep", "log_prob": -0.05}, {"id": 11157, "text": " Learning", "log_prob": '
        b'-1.25}], "prefill": [{"id": 1, "text": "", "log_prob": null}, {"id": 1724, "text": '
        b'"What", "log_prob": -7.868}, {"id": 338, "text": " is", "log_prob": -1.25}]}}')


@pytest.mark.anyio
async def test_stream_merges_the_last_token_with_its_finish() -> None:
    with respx.mock() as r:
        r.post(url__regex=COMPLETIONS).mock(return_value=httpx.Response(
            200, content=STREAM, headers=SSE))
        resp = await call(r, {"inputs": PROMPT, "stream": True,
                              "parameters": {"details": True}}, cfg(), path="/invocations")
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/jsonlines"
    lines = resp.content.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert lines[0] == b'{"token": {"id": 304, "text": "Deep", "log_prob": -0.05}}'
    assert orjson.loads(lines[1]) == {
        "token": {"id": 11157, "text": " Learning", "log_prob": -1.25},
        "generated_text": "Deep Learning",
        "details": {"finish_reason": "length", "generated_tokens": 2, "inputs": PROMPT}}


@pytest.mark.anyio
@pytest.mark.parametrize(("lmi", "media", "token"), [
    ({"tgi_compat": True}, "text/event-stream", {"id": 304, "text": "Deep", "logprob": -0.05}),
    ({"output_formatter": "sse"}, "text/event-stream",
     {"id": 304, "text": "Deep", "log_prob": -0.05})])
async def test_predictions_uses_the_named_models_framing(lmi: dict[str, Any], media: str,
                                                         token: dict[str, Any]) -> None:
    with respx.mock() as r:
        route = r.post(url__regex=COMPLETIONS).mock(return_value=httpx.Response(
            200, content=STREAM, headers=SSE))
        resp = await call(r, {"inputs": PROMPT, "stream": True},
                          cfg(named={"lmi": lmi, "upstream_model": "org/named"}),
                          path="/predictions/named")
    assert orjson.loads(route.calls.last.request.content)["model"] == "org/named"
    assert resp.headers["content-type"] == media
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in resp.content.split(b"\n\n") if e]
    assert events[0] == {"token": token}
    assert ("details" in events[-1]) == bool(lmi.get("tgi_compat"))  # on by default there


@pytest.mark.anyio
async def test_mid_stream_break_ends_with_seed_003_error_line() -> None:
    with respx.mock() as r:
        r.post(url__regex=COMPLETIONS).mock(return_value=httpx.Response(
            200, stream=Broken([chunk("Deep", 304, -0.05), chunk(" Learning", 11157, -1.25)]),
            headers=SSE))
        no_failover = cfg().model_copy(update={"server": config.ServerConfig(failover_attempts=0)})
        resp = await call(r, {"inputs": PROMPT, "stream": True}, no_failover, path="/invocations")
    assert resp.status_code == 200
    lines = [orjson.loads(x) for x in resp.content.splitlines()]
    assert [x["token"]["id"] for x in lines] == [304, 11157, -1]
    assert lines[-1] == {"token": {"id": -1, "text": "", "log_prob": -1, "special_token": True},
                         "generated_text": "",
                         "details": {"finish_reason": "error", "generated_tokens": None,
                                     "inputs": None}}


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_workers_down_is_503_in_the_lmi_error_body(stream: bool) -> None:
    with respx.mock(assert_all_called=False) as r:
        r.post(url__regex=COMPLETIONS).mock(side_effect=httpx.ConnectError("refused"))
        resp = await call(r, {"inputs": PROMPT, "stream": stream}, cfg(), path="/invocations")
    assert resp.status_code == 503
    out = resp.json()
    assert list(out) == ["error", "code"] and out["code"] == 503


@pytest.mark.anyio
async def test_worker_refusing_a_parameter() -> None:
    """A worker's refusal is {"error", "code"} with its message kept, in every schema, 424 as
    for a validation failure (SPEC.md; issue 12: never seed 003's message-less shell)."""
    refusal = httpx.Response(400, json={"error": {"message": "max_tokens is too large",
                                                  "type": "BadRequestError", "param": None,
                                                  "code": 400}})
    with respx.mock(assert_all_called=False) as r:
        r.post(url__regex=COMPLETIONS).mock(return_value=refusal)
        r.post(url__regex=CHAT).mock(return_value=refusal)
        rolling = await call(r, {"inputs": PROMPT}, cfg(), path="/invocations")
        chat = await call(r, {"messages": [{"role": "user", "content": "Hi"}]}, cfg(),
                          path="/invocations")
    assert rolling.status_code == 424
    assert rolling.json() == {"error": "max_tokens is too large", "code": 424}
    assert chat.status_code == 424
    assert chat.json() == {"error": "max_tokens is too large", "code": 424}


@pytest.mark.anyio
async def test_a_worker_that_gives_no_token_ids_still_answers_details() -> None:
    """SPEC.md: ids a client's format always carries are -1 ("unknown") when neither the
    worker nor a tokenizer gives them; what is asked by name (prefill) is a 424 before I/O.
    A plain OpenAI server's whole body is one text, so the answer is asked as a stream and
    each chunk is a token of the details, as on the answer's stream (gateway.whole)."""
    plain = (b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m",'
             b'"choices":[{"index":0,"text":"%s","finish_reason":%s}]}\n\n')
    stream = (plain % (b"Deep", b"null") + plain % (b" Learning", b'"length"') + USAGE
              + b"data: [DONE]\n\n")
    with respx.mock(assert_all_called=False) as r:
        route = r.post(url__regex=COMPLETIONS).mock(
            return_value=httpx.Response(200, content=stream, headers=SSE))
        c = cfg(plain={"backend": "openai"})
        details = await call(r, {"inputs": PROMPT, "parameters": {"details": True}}, c,
                             path="/predictions/plain")
        assert route.call_count == 1
        refused = await call(r, {"inputs": PROMPT, "parameters": {
            "details": True, "decoder_input_details": True}}, c, path="/predictions/plain")
        assert route.call_count == 1
    assert orjson.loads(route.calls[0].request.content)["stream"] is True
    assert details.status_code == 200
    assert details.json()["generated_text"] == "Deep Learning"
    assert details.json()["details"]["finish_reason"] == "length"
    assert details.json()["details"]["generated_tokens"] == 2
    assert details.json()["details"]["tokens"] == [
        {"id": -1, "text": "Deep", "log_prob": None}, {"id": -1, "text": " Learning", "log_prob": None}]
    # named as the client wrote it (decoder_input_details asks the worker for prompt_logprobs)
    assert refused.status_code == 424 and "`parameters.decoder_input_details`" in refused.json()["error"]


@pytest.mark.anyio
async def test_unknown_model_is_404_in_the_lmi_body() -> None:
    with respx.mock(assert_all_called=False) as r:
        resp = await call(r, {"inputs": PROMPT}, cfg(), path="/predictions/nope")
    assert resp.status_code == 404
    assert resp.json() == {"error": "The model `nope` does not exist.", "code": 404}


@pytest.mark.anyio
async def test_dynamic_batch_end_to_end() -> None:
    whole = orjson.dumps({"id": "c", "object": "text_completion", "created": 1, "model": "m",
                          "choices": [{"index": 0, "text": " A", "finish_reason": "length"},
                                      {"index": 1, "text": " B", "finish_reason": "length"}],
                          "usage": {"prompt_tokens": 4, "total_tokens": 6,
                                    "completion_tokens": 2}})
    with respx.mock() as r:
        route = r.post(url__regex=COMPLETIONS).mock(return_value=httpx.Response(200,
                                                                                content=whole))
        resp = await call(r, {"inputs": ["a", "b"], "parameters": {"return_full_text": True}},
                          cfg(), path="/invocations")
    assert orjson.loads(route.calls.last.request.content)["prompt"] == ["a", "b"]
    assert resp.content == b'[\n  {\n    "generated_text":"a A"\n  },\n  {\n    ' \
                           b'"generated_text":"b B"\n  }\n]'


@pytest.mark.anyio
async def test_chat_stream_sse_through_the_app() -> None:
    sse = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
           b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
           b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
           b'[{"index":0,"delta":{"content":"Hello"},"finish_reason":"stop",'
           b'"stop_reason":null}]}\n\ndata: [DONE]\n\n')
    with respx.mock() as r:
        r.post(url__regex=CHAT).mock(return_value=httpx.Response(200, content=sse, headers=SSE))
        resp = await call(r, {"messages": [{"role": "user", "content": "Hi"}], "stream": True},
                          cfg(sse={"lmi": {"output_formatter": "sse"}}),
                          path="/predictions/sse")
    assert resp.headers["content-type"] == "text/event-stream"
    events = [orjson.loads(e.removeprefix(b"data: ")) for e in resp.content.split(b"\n\n") if e]
    assert len(events) == 1 and b"[DONE]" not in resp.content
    assert events[0]["choices"] == [{"index": 0, "delta": {"content": "Hello",
                                                           "role": "assistant"},
                                     "logprobs": None, "finish_reason": "eos_token"}]


@pytest.mark.anyio
async def test_ping() -> None:
    ok = await get("/ping", cfg())
    assert ok.status_code == 200
    assert ok.content == b'{\n  "demo": {\n    "status": "Healthy"\n  }\n}\n'
    down = config.Config.model_validate({"default_model": "demo", "models": [{"name": "demo"}]})
    bad = await get("/ping", down)
    assert bad.status_code == 503 and orjson.loads(bad.content) == {
        "demo": {"status": "Unhealthy"}}


@pytest.mark.anyio
async def test_worker_failing_the_generation_non_stream() -> None:
    """A worker that answers 500 (vLLM's engine error) failed the generation: the gateway's
    502 in the {"error", "code"} body with the worker's message (issue 12), as an unreachable
    one is a 503 in that body (SPEC.md)."""
    failed = httpx.Response(500, json={"error": {"message": "engine died", "code": 500,
                                                 "type": "InternalServerError", "param": None}})
    with respx.mock(assert_all_called=False) as r:
        r.post(url__regex=COMPLETIONS).mock(return_value=failed)
        resp = await call(r, {"inputs": PROMPT}, cfg(), path="/invocations")
    assert resp.status_code == 502
    assert resp.json() == {"error": "engine died", "code": 502}
