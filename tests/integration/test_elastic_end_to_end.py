"""Elasticsearch's side of the gateway, end to end: real gateway and simulator processes.

(a) The official `elasticsearch` client's transport on the Elastic routes: it checks
`X-Elastic-Product` on every 2xx (elasticsearch `_sync/client/_base.py`), rewrites
`application/json` to `application/vnd.elasticsearch+json; compatible-with=9`, reads
`text/event-stream` as text and raises its typed errors on 4xx/5xx. The released client has no
method for the unified chat API, so chat goes through `perform_request` (wire-formats.md 7.6).
(b) The gateway as an Elasticsearch `openai` inference target: Elasticsearch's own request
bodies replayed against /v1/chat/completions, every answer checked against its parsers
(tests/unit/test_elastic_target.py).
Tool calls both ways: the simulator calls the first tool it is given; /_sim/last_request shows
what the worker was sent.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from elasticsearch import (
    ApiError,
    AsyncElasticsearch,
    AuthenticationException,
    BadRequestError,
    Elasticsearch,
    NotFoundError,
    UnsupportedProductError,
)

from adapters.frontends import elastic_encode as enc
from schemas import elastic as wire
from tests.integration import procs
from tests.unit import test_elastic_target as target

pytestmark = pytest.mark.integration

SSE = {"accept": "text/event-stream", "content-type": "application/json"}
ASK = [{"role": "user", "content": "What is Elastic? [[sim tokens=4]]"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_current_price", "description": "Price of an item",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}}}}]


def config(sim_url: str, framing: str, keys: str = "[]") -> str:
    # failover off: these tests read the in-band error a cut stream ends with (failover has
    # its own tests in test_failover.py)
    return f"""
server: {{timeouts: {{first_byte: 10, idle: 5}}, failover_attempts: 0, api_keys: {keys}}}
default_model: demo
elastic: {{framing: {framing}}}
models:
  - name: demo
    aliases: [my-chat, org/demo]
    backend: vllm
    upstreams: [{sim_url}]
    upstream_model: org/demo-model
"""


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("elastic")
    sim, sim_url = procs.simulator(tmp)
    started: list[procs.Proc] = [sim]
    try:
        gw, url = procs.gateway(tmp, config(sim_url, "documented"))
        started.append(gw)
        gw_server, url_server = procs.gateway(tmp, config(sim_url, "server"))
        started.append(gw_server)
        gw_keyed, url_keyed = procs.gateway(tmp, config(sim_url, "documented", "[k1]"))
        started.append(gw_keyed)
        yield {"gw": url, "server": url_server, "keyed": url_keyed, "sim": sim_url}
    finally:
        for p in reversed(started):
            p.stop()


@pytest.fixture
def es(urls: dict[str, str]) -> Elasticsearch:
    return Elasticsearch(urls["gw"], request_timeout=20, max_retries=0)


def last_upstream(urls: dict[str, str]) -> dict[str, Any]:
    seen: dict[str, Any] = httpx.get(urls["sim"] + "/_sim/last_request", timeout=5).json()
    return seen


def chunks(body: str, server: bool = False) -> list[wire.ChatCompletionChunk]:
    """The chunks of an Elastic chat stream, each validated; it must end with [DONE]."""
    raw = body.encode()
    out, done = [], False
    for block in raw.split(b"\n\n")[:-1]:
        name, data = block.split(b"\n")
        assert name == (enc.BOM if server else b"") + b"event: message", block
        payload = data.removeprefix(b"data: ")
        if payload == b"[DONE]":
            done = True
            continue
        out.append(wire.ChatCompletionChunk.model_validate_json(payload) if server
                   else wire.ChunkEnvelope.model_validate_json(payload).chat_completion)
    assert done and out[-1].usage is not None and out[-1].choices == []
    return out


def text_of(cs: list[wire.ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in cs if c.choices)


@pytest.mark.parametrize("path", ["/_inference/chat_completion/demo/_stream",
                                  "/_inference/chat_completion/demo/_unified",
                                  "/_inference/my-chat/_unified", "/_inference/demo/_stream"])
def test_client_streams_chat_on_every_path(es: Elasticsearch, path: str) -> None:
    resp = es.perform_request("POST", path, headers=SSE, body={"messages": ASK})
    assert resp.meta.status == 200
    assert resp.meta.headers["x-elastic-product"] == "Elasticsearch"
    assert resp.meta.headers["content-type"] == "text/event-stream"
    cs = chunks(resp.body)
    assert text_of(cs) and cs[-1].usage is not None and cs[-1].usage.completion_tokens >= 4


def test_the_product_check_is_what_the_header_passes(urls: dict[str, str]) -> None:
    """A 2xx without `X-Elastic-Product` (the OpenAI route) is refused by the client."""
    es = Elasticsearch(urls["gw"], request_timeout=20, max_retries=0)
    with pytest.raises(UnsupportedProductError):
        es.perform_request("POST", "/v1/chat/completions", headers=SSE,
                           body={"model": "demo", "messages": ASK, "stream": True})


def test_client_on_a_server_framed_gateway(urls: dict[str, str]) -> None:
    """`elastic.framing: server`: a BOM before every event, bare chunks; the client's
    `application/json` goes out as `application/vnd.elasticsearch+json; compatible-with=9`
    (`mimetype_header_to_compat`) and is read as JSON."""
    es = Elasticsearch(urls["server"], request_timeout=20, max_retries=0)
    resp = es.perform_request("POST", "/_inference/chat_completion/demo/_stream", headers=SSE,
                              body={"messages": ASK})
    assert resp.body.startswith("\ufeffevent: message\ndata: {")
    assert text_of(chunks(resp.body, server=True))


def test_client_completion_task(es: Elasticsearch, urls: dict[str, str]) -> None:
    resp = es.inference.completion(inference_id="demo", input="Hi [[sim tokens=3]]",
                                   task_settings={"user": "a_user"})
    assert resp.meta.headers["content-type"] == \
        "application/vnd.elasticsearch+json;compatible-with=9"
    result = resp.body["completion"][0]["result"]
    assert isinstance(result, str) and result
    sent = last_upstream(urls)["body"]
    assert sent["messages"] == [{"role": "user", "content": "Hi [[sim tokens=3]]"}]
    # no `max_tokens`: a chat answer as long as the context allows, asked of the worker as a
    # stream and folded (gateway.whole), so first_byte bounds only its first token
    assert sent["user"] == "a_user" and sent["stream"] is True
    streamed = es.perform_request("POST", "/_inference/completion/demo/_stream", headers=SSE,
                                  body={"input": "Hi [[sim tokens=3]]"})
    events = [b.split("\n")[1].removeprefix("data: ") for b in streamed.body.split("\n\n")[:-1]]
    assert events[-1] == "[DONE]"
    deltas = [wire.StreamingCompletionResults.model_validate_json(e).completion[0].delta
              for e in events[:-1]]
    assert "".join(deltas) == result  # the simulator is deterministic


def test_client_raises_elasticsearchs_errors(es: Elasticsearch) -> None:
    with pytest.raises(NotFoundError) as missing:
        es.perform_request("POST", "/_inference/chat_completion/nope/_stream", headers=SSE,
                           body={"messages": ASK})
    assert missing.value.meta.headers["x-elastic-product"] == "Elasticsearch"
    assert "Inference endpoint not found [nope]" in missing.value.body
    with pytest.raises(BadRequestError) as unknown:
        es.perform_request("POST", "/_inference/chat_completion/demo/_stream", headers=SSE,
                           body={"messages": ASK, "max_tokens": 5})
    event = unknown.value.body.split("\n")
    assert event[0] == "event: error"
    message = wire.UnifiedError.model_validate_json(event[1].removeprefix("data: ")).error.message
    assert re.fullmatch(r"\[1:\d+\] \[UnifiedCompletionRequest\] unknown field \[max_tokens\]",
                        message), message
    with pytest.raises(NotFoundError) as gone:
        es.inference.completion(inference_id="nope", input="x")
    assert gone.value.message == "resource_not_found_exception"  # the client's reading of it


def test_paths_without_a_task_type(es: Elasticsearch, urls: dict[str, str]) -> None:
    """elasticsearch-py `inference.inference(inference_id=..., input=...)` POSTs
    /_inference/{id} (RestInferenceAction INFERENCE_ID_PATH): `input` is the completion task;
    a chat body is answered whole, as TransportInferenceActionProxy answers a chat_completion
    endpoint there. On every path without a task type an unknown id is ES's generic 404
    before the body is read (doExecute, TaskType.ANY: ModelRegistry first)."""
    resp = es.inference.inference(inference_id="demo", input="Hi [[sim tokens=3]]")
    assert resp.meta.headers["x-elastic-product"] == "Elasticsearch"
    assert resp.body["completion"][0]["result"]
    assert last_upstream(urls)["body"]["messages"] == [
        {"role": "user", "content": "Hi [[sim tokens=3]]"}]
    whole = es.perform_request("POST", "/_inference/my-chat",
                               headers={"accept": "application/json",
                                        "content-type": "application/json"},
                               body={"messages": ASK})
    assert wire.ChatCompletion.model_validate(whole.body).choices[0].message.content
    with pytest.raises(NotFoundError) as gone:
        es.inference.inference(inference_id="nope", input="x")
    assert gone.value.body["error"]["reason"] == "Inference endpoint not found [nope]"
    with pytest.raises(NotFoundError) as missing:
        es.perform_request("POST", "/_inference/nope/_stream", headers=SSE,
                           body={"messages": [], "max_tokens": 5})
    event = missing.value.body.split("\n")
    assert event[0] == "event: error"
    assert wire.EsError.model_validate_json(event[1].removeprefix("data: ")).status == 404
    with pytest.raises(BadRequestError) as empty:
        es.perform_request("POST", "/_inference/demo/_stream", headers=SSE, body={"messages": []})
    generic = wire.EsError.model_validate_json(empty.value.body.split("\n")[1][6:])
    assert generic.error.type == "action_request_validation_exception"


def test_worker_failures_before_and_after_the_first_chunk(es: Elasticsearch) -> None:
    with pytest.raises(Exception) as refused:
        es.perform_request("POST", "/_inference/chat_completion/demo/_stream", headers=SSE,
                           body={"messages": [{"role": "user", "content": "x [[sim fail=503]]"}]})
    assert getattr(refused.value, "status_code", None) in (502, 503)
    assert refused.value.body.startswith("event: error\n")  # type: ignore[attr-defined]
    cut = es.perform_request("POST", "/_inference/chat_completion/demo/_stream", headers=SSE,
                             body={"messages": [{"role": "user",
                                                 "content": "x [[sim tokens=8 drop_after=3]]"}]})
    assert cut.meta.status == 200
    last = cut.body.split("\n\n")[-2].split("\n")
    assert last[0] == "event: error" and "[DONE]" not in cut.body
    assert wire.UnifiedError.model_validate_json(last[1][6:]).error.code == "stream_error"


def test_tool_calls_round_trip(es: Elasticsearch, urls: dict[str, str]) -> None:
    """A tool call streamed by the worker arrives as Elastic tool-call deltas; the client's
    assistant tool_calls and tool message reach the worker in OpenAI's form."""
    ask = [{"role": "user", "content": [{"type": "text", "text": "Price of a scarf?"}]}]
    resp = es.perform_request("POST", "/_inference/chat_completion/demo/_stream", headers=SSE,
                              body={"messages": ask, "tools": TOOLS, "tool_choice": "auto"})
    cs = chunks(resp.body)
    calls = [t for c in cs if c.choices for t in c.choices[0].delta.tool_calls or ()]
    first = calls[0]
    assert first.id and first.type == "function" and first.function is not None
    assert first.function.name == "get_current_price"
    arguments = "".join(t.function.arguments or "" for t in calls if t.function)
    assert isinstance(orjson.loads(arguments), dict)
    assert [c.choices[0].finish_reason for c in cs if c.choices][-1] == "tool_calls"
    history = [*ask,
               {"role": "assistant", "content": "Let me look.", "tool_calls": [{
                   "id": first.id, "type": "function",
                   "function": {"name": "get_current_price", "arguments": arguments}}]},
               {"role": "tool", "content": "12 EUR", "tool_call_id": first.id}]
    answer = es.perform_request("POST", "/_inference/chat_completion/demo/_stream",
                                headers=SSE, body={"messages": history})
    assert text_of(chunks(answer.body))
    sent = last_upstream(urls)["body"]["messages"]
    assert sent[0] == {"role": "user", "content": [{"type": "text", "text": "Price of a scarf?"}]}
    assert sent[1]["tool_calls"] == [{"id": first.id, "type": "function", "function": {
        "name": "get_current_price", "arguments": arguments}}]
    assert sent[2] == {"role": "tool", "content": "12 EUR", "tool_call_id": first.id}


@pytest.mark.parametrize("name", list(target.STREAMING))
def test_es_openai_service_requests_replayed(urls: dict[str, str], name: str) -> None:
    """Elasticsearch's bodies (its `url` pointing at /v1/chat/completions) are accepted, and
    every chunk of the answer is one its parsers take, tool-call deltas included."""
    resp = httpx.post(urls["gw"] + "/v1/chat/completions", json=target.STREAMING[name],
                      headers={"authorization": "Bearer es-api-key"}, timeout=20)
    assert resp.status_code == 200, resp.text
    for gen in target.GENERATIONS:
        got = target.check_stream(resp.content, gen)
        assert got
    if "tools" in target.STREAMING[name]:
        assert any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in got)
    sent = last_upstream(urls)["body"]
    assert sent["model"] == "org/demo-model"


@pytest.mark.parametrize("name", list(target.WHOLE))
def test_es_non_streaming_and_validation_calls_replayed(urls: dict[str, str], name: str) -> None:
    resp = httpx.post(urls["gw"] + "/v1/chat/completions", json=target.WHOLE[name], timeout=20)
    assert resp.status_code == 200, resp.text
    assert target.check_whole(resp.content)


def test_model_less_es_bodies_replayed(urls: dict[str, str]) -> None:
    """hugging_face without model_id and SageMaker's openai schema send no `model`."""
    streamed = httpx.post(urls["gw"] + "/v1/chat/completions", json=target.SAGEMAKER_STREAM,
                          timeout=20)
    assert target.check_stream(streamed.content, "parser")
    whole = httpx.post(urls["gw"] + "/v1/chat/completions", json=target.HF_NO_MODEL, timeout=20)
    assert target.check_whole(whole.content)


def test_inference_method_with_a_task_type(es: Elasticsearch, urls: dict[str, str]) -> None:
    """elasticsearch-py `inference.inference(task_type=..., inference_id=...)` POSTs
    /_inference/{task_type}/{inference_id} (Paths.java INFERENCE_ID_PATH with a task type):
    `completion` takes `input`; `chat_completion` answers a unified chat body whole (ES 9.x)
    and, as UnifiedCompletionRequest.PARSER, refuses `input` as an unknown field."""
    done = es.inference.inference(inference_id="my-chat", task_type="completion",
                                  input="Hi [[sim tokens=3]]")
    assert done.meta.headers["x-elastic-product"] == "Elasticsearch"
    assert isinstance(done.body["completion"][0]["result"], str)
    chat = es.inference.inference(inference_id="demo", task_type="chat_completion",
                                  body={"messages": ASK, "max_completion_tokens": 2})
    whole = wire.ChatCompletion.model_validate(chat.body)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason == "length"
    sent = last_upstream(urls)["body"]
    assert sent.get("max_completion_tokens", sent.get("max_tokens")) == 2
    with pytest.raises(BadRequestError) as unknown:
        es.inference.inference(inference_id="demo", task_type="chat_completion", input="x")
    assert "unknown field [input]" in unknown.value.body["error"]["message"]
    with pytest.raises(BadRequestError) as several:
        es.inference.completion(inference_id="demo", input=["a", "b"])
    assert several.value.body["status"] == 400


def test_errors_on_the_completion_task(es: Elasticsearch) -> None:
    """ES's generic error JSON (`{"error": {"root_cause", "type", "reason"}, "status"}`) for a
    body without `input`, an unknown field, and a worker failure (status_exception with the
    gateway's status); on `_stream` a failure after the first chunk is `event: error` after
    HTTP 200 (ServerSentEventsRestActionListener.onFailure), no [DONE]."""
    with pytest.raises(BadRequestError) as missing:
        es.inference.completion(inference_id="demo", body={})
    assert missing.value.message == "action_request_validation_exception"
    with pytest.raises(BadRequestError) as extra:
        es.inference.completion(inference_id="demo", body={"input": "x", "foo": 1})
    assert "unknown field [foo]" in extra.value.body["error"]["reason"]
    with pytest.raises(ApiError) as failed:
        es.inference.completion(inference_id="demo", input="x [[sim error_after=1]]")
    assert failed.value.status_code >= 500 and failed.value.message == "status_exception"
    cut = es.perform_request("POST", "/_inference/completion/demo/_stream", headers=SSE,
                             body={"input": "x [[sim tokens=8 error_after=2]]"})
    blocks = cut.body.split("\n\n")[:-1]
    assert cut.meta.status == 200 and "[DONE]" not in cut.body
    assert blocks[0].startswith("event: message\n")
    name, data = blocks[-1].split("\n")
    assert name == "event: error"
    assert wire.EsError.model_validate_json(data.removeprefix("data: ")).status >= 500


def test_client_gets_the_inference_endpoints(urls: dict[str, str]) -> None:
    """elasticsearch-py `inference.get`, sync and async, on a gateway with API keys: GET
    _inference, _inference/{id}, _inference/{task_type}/{id} and _inference/{task_type}/_all
    (RestGetInferenceModelAction) list each model name and alias as an endpoint
    (GetInferenceModelAction.Response, ModelConfigurations.toFilteredXContent); an unknown id
    is ModelRegistry's 404 and a task type the endpoint does not serve a 400
    (InferenceExceptions.mismatchedTaskTypeException), in elastic/elasticsearch. The route
    needs a key as every inference route does (SPEC.md server.api_keys)."""
    es = Elasticsearch(urls["keyed"], api_key="k1", request_timeout=20, max_retries=0)
    listed = es.inference.get()
    assert listed.meta.headers["x-elastic-product"] == "Elasticsearch"
    assert [e["inference_id"] for e in listed["endpoints"]] == ["demo", "my-chat", "org/demo"]
    assert es.inference.get(inference_id="my-chat")["endpoints"] == [{
        "inference_id": "my-chat", "task_type": "chat_completion", "service": "gateway",
        "service_settings": {"model_id": "org/demo-model"}}]
    one = es.inference.get(task_type="completion", inference_id="demo")["endpoints"]
    assert [(e["inference_id"], e["task_type"]) for e in one] == [("demo", "completion")]
    assert len(es.inference.get(task_type="completion")["endpoints"]) == 3
    assert es.inference.get(task_type="text_embedding")["endpoints"] == []
    with pytest.raises(NotFoundError) as gone:
        es.inference.get(inference_id="nope")
    assert gone.value.message == "resource_not_found_exception"
    assert gone.value.body["error"]["reason"] == "Inference endpoint not found [nope]"
    with pytest.raises(BadRequestError) as other:
        es.inference.get(task_type="text_embedding", inference_id="demo")
    assert other.value.message == "status_exception" and other.value.body["status"] == 400
    with pytest.raises(AuthenticationException):
        Elasticsearch(urls["keyed"], request_timeout=20, max_retries=0).inference.get()

    async def in_async() -> None:
        aes = AsyncElasticsearch(urls["keyed"], api_key="k1", request_timeout=20,
                                 max_retries=0)
        try:
            got = await aes.inference.get(inference_id="demo")
            assert got["endpoints"][0]["inference_id"] == "demo"
            with pytest.raises(NotFoundError) as missing:
                await aes.inference.get(task_type="completion", inference_id="nope")
            assert missing.value.status_code == 404
        finally:
            await aes.close()

    asyncio.run(in_async())


def test_client_methods_of_the_tasks_a_model_does_not_serve(es: Elasticsearch) -> None:
    """elasticsearch-py `inference.text_embedding`, `rerank` and `inference.inference` with a
    task type POST /_inference/{task_type}/{id} (RestInferenceAction): the task type parsed in
    any case, unknown a 400 (TaskType.fromStringOrStatusException); an unknown id a 404; a task
    the endpoint does not serve a 400 (BaseTransportInferenceAction
    .requestModelTaskTypeMismatchException), in elastic/elasticsearch."""
    with pytest.raises(BadRequestError) as other:
        es.inference.text_embedding(inference_id="demo", input="hi")
    assert other.value.message == "status_exception"
    assert other.value.body["error"]["reason"] == (
        "Incompatible task_type, the requested type [text_embedding] does not match the model "
        "type [chat_completion]")
    with pytest.raises(NotFoundError):
        es.inference.rerank(inference_id="nope", input=["a"], query="q")
    with pytest.raises(BadRequestError) as bogus:
        es.inference.inference(task_type="bogus", inference_id="demo", input="x")
    assert bogus.value.body["error"]["reason"] == "Unknown task_type [bogus]"
    done = es.inference.inference(task_type="Completion", inference_id="my-chat",
                                  input="Hi [[sim tokens=2]]")
    assert done["completion"][0]["result"]


def test_an_inference_id_with_a_slash(es: Elasticsearch) -> None:
    """elasticsearch-py percent-encodes a `/` in an inference id (`_quote`: `org%2Fdemo`);
    Elasticsearch splits the path before decoding each part (RestUtils.decodeComponent), so
    the id keeps its slash: a gateway model name or alias like `org/demo` is reachable."""
    done = es.inference.completion(inference_id="org/demo", input="Hi [[sim tokens=2]]")
    assert done["completion"][0]["result"]
    got = es.inference.get(task_type="completion", inference_id="org/demo")
    assert got["endpoints"][0]["inference_id"] == "org/demo"
    with pytest.raises(NotFoundError) as gone:
        es.inference.inference(inference_id="org/nope", input="x")
    assert gone.value.body["error"]["reason"] == "Inference endpoint not found [org/nope]"


def test_client_info_and_ping_on_the_root(urls: dict[str, str]) -> None:
    """elasticsearch-py's first call is often `info()` (GET /) or `ping()` (HEAD /): both must
    pass its product check (`X-Elastic-Product` on a 2xx, `_base.py`), and `info()` reads
    Elasticsearch's root answer (RestMainAction: MainResponse.toXContent, `name`,
    `cluster_name`, `cluster_uuid`, `version.number`, ..., `tagline`). TGI's clients, which
    send no Elastic client header, still get TGI's empty health answer at GET / (server.rs)."""
    es = Elasticsearch(urls["gw"], request_timeout=20, max_retries=0)
    info = es.info()
    assert info.meta.headers["x-elastic-product"] == "Elasticsearch"
    assert info["tagline"] == "You Know, for Search"
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["version"]["number"])
    assert {"name", "cluster_name", "cluster_uuid"} <= info.body.keys()
    assert Elasticsearch(urls["gw"], request_timeout=20, max_retries=0).ping() is True
    assert Elasticsearch(urls["keyed"], api_key="k1", request_timeout=20).ping() is True
    assert Elasticsearch(urls["keyed"], request_timeout=20, max_retries=0).ping() is False
    plain = httpx.get(urls["gw"] + "/")
    assert (plain.status_code, plain.content) == (200, b"")
    assert "x-elastic-product" not in plain.headers
