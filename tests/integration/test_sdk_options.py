"""The official clients' own settings against a running gateway: each option that changes what
goes on the wire (headers, auth forms, query strings, extra body fields, raw and streaming
responses, async transports, compression) works as against the real server the client was
written for: vLLM for openai, TGI for huggingface_hub, Elasticsearch for elasticsearch-py.

One gateway with API keys in front of the simulator; /_sim/last_request shows what a call
became upstream.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from elasticsearch import (
    ApiError,
    AsyncElasticsearch,
    AuthenticationException,
    Elasticsearch,
    NotFoundError,
)
from huggingface_hub import AsyncInferenceClient

from tests.integration import procs

pytestmark = pytest.mark.integration

KEY = "sekret"
# An Elasticsearch API key as its clients send it: `ApiKey base64(id:key)` (elastic-transport
# client_utils.py; x-pack security ApiKeyService.getCredentialsFromHeader).
ES_ID, ES_SECRET = "key-id", "key-secret"
ES_ENCODED = base64.b64encode(f"{ES_ID}:{ES_SECRET}".encode()).decode()
MSG = [{"role": "user", "content": "hello"}]
SSE = {"accept": "text/event-stream", "content-type": "application/json"}


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("sdkopt")
    with procs.demo_gateway(tmp, f"{{api_keys: [{KEY}, {ES_ENCODED}], "
                                 "timeouts: {first_byte: 10, idle: 5}}", "--tokens", "6") as urls:
        yield urls


def last_upstream(sim_url: str) -> dict[str, Any]:
    seen: dict[str, Any] = httpx.get(sim_url + "/_sim/last_request", timeout=5).json()
    return seen


def test_elasticsearch_echoes_the_opaque_id_on_every_answer(urls: tuple[str, str]) -> None:
    """elasticsearch-py's `opaque_id` (client `__init__` and `.options()`) sends X-Opaque-Id;
    Elasticsearch copies it onto every answer, success or error (server DefaultRestChannel
    .sendResponse: `setHeaderField(httpResponse, X_OPAQUE_ID, opaque)`), which is how its users
    tie a response to the request in their logs. The gateway sent it back on none."""
    url = urls[0]
    es = Elasticsearch(url, api_key=KEY, opaque_id="op-1", request_timeout=20, max_retries=0)
    done = es.inference.completion(inference_id="demo", input="x")
    assert done.meta.headers["x-opaque-id"] == "op-1"
    stream = es.options(opaque_id="op-2").perform_request(
        "POST", "/_inference/chat_completion/demo/_stream", headers=SSE, body={"messages": MSG})
    assert stream.meta.headers["x-opaque-id"] == "op-2" and "[DONE]" in str(stream.body)
    assert es.info().meta.headers["x-opaque-id"] == "op-1"  # GET /, RestMainAction
    assert es.inference.get(inference_id="demo").meta.headers["x-opaque-id"] == "op-1"
    with pytest.raises(NotFoundError) as missing:
        es.inference.completion(inference_id="nope", input="x")
    assert missing.value.meta.headers["x-opaque-id"] == "op-1"
    with pytest.raises(AuthenticationException) as refused:
        Elasticsearch(url, api_key="wrong", opaque_id="op-3", max_retries=0).inference.completion(
            inference_id="demo", input="x")
    assert refused.value.meta.headers["x-opaque-id"] == "op-3"
    with pytest.raises(ApiError) as unknown:  # a path no route takes, in ES's error form
        es.perform_request("POST", "/_inference/completion/demo/_nothing/here",
                           headers={"content-type": "application/json"}, body={})
    assert unknown.value.meta.headers["x-opaque-id"] == "op-1"
    # Only Elasticsearch's routes: vLLM's OpenAI server has no such header.
    other = httpx.post(url + "/v1/chat/completions", timeout=20, json={
        "model": "demo", "messages": MSG}, headers={"x-opaque-id": "op-4", "x-api-key": KEY})
    assert other.status_code == 200 and "x-opaque-id" not in other.headers


def test_elasticsearch_node_classes_and_auth_forms(urls: tuple[str, str]) -> None:
    """Every transport elastic-transport offers (urllib3 and requests; aiohttp and httpx for
    AsyncElasticsearch), with `http_compress` (gzip bodies, gateway/content_encoding.py), and
    each credential form the client sends that SPEC's `server.api_keys` takes: `api_key` as a
    string or an (id, key) tuple (`ApiKey base64(id:key)`, the key configured in that encoded
    form, as Elasticsearch itself compares it), `bearer_auth`, an `x-api-key` header. Basic
    auth (a user and password, Elasticsearch's native realm) is no API key: a 401, which the
    client raises as AuthenticationException."""
    url = urls[0]
    for node in ("urllib3", "requests"):
        for auth in ({"api_key": (ES_ID, ES_SECRET)}, {"api_key": ES_ENCODED},
                     {"bearer_auth": KEY}, {"headers": {"x-api-key": KEY}}):
            es = Elasticsearch(url, node_class=node, http_compress=True, opaque_id=node,
                               request_timeout=20, max_retries=0, **auth)
            out = es.inference.completion(inference_id="demo", input="x")
            assert out.body["completion"][0]["result"] and out.meta.headers["x-opaque-id"] == node
        with pytest.raises(AuthenticationException):
            Elasticsearch(url, node_class=node, basic_auth=("elastic", KEY),
                          max_retries=0).inference.completion(inference_id="demo", input="x")

    async def run(node: str) -> None:
        es = AsyncElasticsearch(url, node_class=node, api_key=(ES_ID, ES_SECRET), opaque_id=node,
                                http_compress=True, request_timeout=20, max_retries=0)
        try:
            out = await es.inference.completion(inference_id="demo", input="x")
            assert out.body["completion"][0]["result"] and out.meta.headers["x-opaque-id"] == node
            stream = await es.perform_request(
                "POST", "/_inference/chat_completion/demo/_stream", headers=SSE,
                body={"messages": MSG})
            assert str(stream.body).endswith("event: message\ndata: [DONE]\n\n")
        finally:
            await es.close()

    for node in ("aiohttp", "httpxasync"):
        asyncio.run(run(node))


def test_openai_request_options_reach_the_worker_as_vllm_reads_them(urls: tuple[str, str]) -> None:
    """openai-python's per-client and per-request options (`_base_client.py` _build_headers,
    _build_request): default and extra headers (organization, project, x-stainless-*), query
    strings (Azure-style `api-version`), `extra_body` fields vLLM reads (its protocol.py
    ChatCompletionRequest: top_k, chat_template_kwargs) reaching the worker and an unknown one
    dropped as vLLM ignores it, `with_options`, raw and streaming responses, the async client,
    and a base URL with a trailing slash. Without `/v1` the client posts /chat/completions,
    which vLLM serves no more than the gateway does: NotFoundError."""
    url, sim = urls
    oa = openai.OpenAI(base_url=url + "/v1/", api_key=KEY, organization="org-1", project="p-1",
                       default_headers={"x-team": "a"}, default_query={"api-version": "1"},
                       max_retries=0, timeout=20)
    out = oa.with_options(timeout=15, max_retries=1).chat.completions.create(
        model="demo", messages=MSG, extra_query={"trace": "1"},
        extra_headers={"x-request-id": "rid-1", "x-stainless-retry-count": "2"},
        extra_body={"top_k": 3, "chat_template_kwargs": {"enable_thinking": False},
                    "not_a_vllm_field": 1})
    assert out.choices[0].message.content and out.id.startswith("chatcmpl-")
    body = last_upstream(sim)["body"]
    assert (body["top_k"], body["chat_template_kwargs"]) == (3, {"enable_thinking": False})
    assert "not_a_vllm_field" not in body
    assert last_upstream(sim)["headers"]["x-request-id"] == "rid-1"
    raw = oa.completions.with_raw_response.create(model="demo", prompt="x", max_tokens=2)
    assert raw.headers["x-request-id"] and raw.parse().choices[0].text
    with oa.chat.completions.with_streaming_response.create(
            model="demo", messages=MSG, stream=True) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert [line for line in streamed.iter_lines() if line][-1] == "data: [DONE]"
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=url, api_key=KEY, max_retries=0).chat.completions.create(
            model="demo", messages=MSG)

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=20)
        stream = await client.chat.completions.create(
            model="demo", messages=MSG, stream=True,
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        raw = await client.chat.completions.with_raw_response.create(
            model="demo", messages=MSG)
        assert raw.http_response.http_version == "HTTP/1.1" and raw.parse().choices
        await client.close()

    asyncio.run(run())


@pytest.mark.filterwarnings("ignore:Setting per-request cookies:DeprecationWarning")  # its own
def test_async_inference_client_options(urls: tuple[str, str]) -> None:
    """huggingface_hub's AsyncInferenceClient (`_generated/_async_client.py`: one httpx client
    for all its calls, its own SSE line reading) with token, headers, cookies and timeout: both
    streams, the `chat.completions.create` alias, a model URL, and a stream left early (the
    client closes it) followed by another call on the same client."""
    url = urls[0]

    async def run() -> None:
        async with AsyncInferenceClient(base_url=url, token=KEY, headers={"x-team": "a"},
                                        cookies={"session": "s"}, timeout=20) as hf:
            text = await hf.text_generation("hi", max_new_tokens=3)
            tokens = [t async for t in await hf.text_generation("hi", max_new_tokens=3,
                                                                stream=True)]
            # POST / is TGI's compat_generate: the full text by default (server.rs)
            assert "hi" + "".join(tokens) == text
            chat = await hf.chat.completions.create(messages=MSG, max_tokens=3)
            deltas = [c.choices[0].delta.content async for c in
                      await hf.chat.completions.create(messages=MSG, max_tokens=3, stream=True)
                      if c.choices]
            assert "".join(d or "" for d in deltas) == chat.choices[0].message.content
            async for _ in await hf.text_generation("hi", max_new_tokens=40, stream=True):
                break
            assert await hf.text_generation("again", max_new_tokens=2)
        async with AsyncInferenceClient(model=url, api_key=KEY, timeout=20) as by_model:
            assert (await by_model.chat_completion(MSG, max_tokens=2)).choices[0].message.content

    asyncio.run(run())
