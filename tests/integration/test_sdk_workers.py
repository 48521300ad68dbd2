"""The official client SDKs against a gateway in front of each non-vLLM worker kind.

One gateway per worker kind (trtllm, triton, tgi, and `openai` pointed at the trtllm fake),
each before its fake running as a process (tests/fakes). Each SDK's main calls, streaming and
not, either answer right as the SDK parses them (text, finish reason, usage, tokens) or fail
with the SDK's own 4xx exception naming what the worker cannot do (SPEC "Worker protocols":
a clear 4xx, never a silently wrong answer): openai 3.x, huggingface_hub InferenceClient,
text-generation 0.7.0 Client and elasticsearch 9.x (its transport; chat via perform_request,
tests/integration/test_elastic_end_to_end.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from elasticsearch import Elasticsearch
from huggingface_hub import InferenceClient
from huggingface_hub import errors as hf_errors

from tests.integration import procs

pytestmark = pytest.mark.integration

TEMPLATE = Path(__file__).parents[1] / "golden" / "triton" / "chat_template.jinja"
FAKES: dict[str, tuple[str, str, dict[str, Any]]] = {  # kind: (module, readiness path, config)
    "trtllm": ("tests.fakes.trtllm_fake", "/health", {"upstream_model": "org/m"}),
    "openai": ("tests.fakes.trtllm_fake", "/health", {"upstream_model": "org/m"}),
    "triton": ("tests.fakes.triton_fake", "/v2/health/ready",
               {"upstream_model": "ensemble", "chat_template": str(TEMPLATE)}),
    "tgi": ("tests.fakes.tgi_fake", "/health", {}),
}
# What each worker can give (else a 400 naming the field): several sequences, token logprobs,
# tool calls, a list of prompts, prompt logprobs.
CAN: dict[str, set[str]] = {
    "trtllm": {"n", "logprobs", "tools", "prompts"},
    "openai": {"n", "logprobs", "tools", "prompts"},
    "triton": set(),
    "tgi": {"logprobs", "tools", "prompt_logprobs", "best_of"},
}
MSGS = [{"role": "user", "content": "What is 6x7?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_price", "description": "Price of an item",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}}}}]
SSE = {"accept": "text/event-stream", "content-type": "application/json"}


@pytest.fixture(scope="module", params=sorted(FAKES))
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
       ) -> Iterator[tuple[str, str]]:
    kind: str = request.param
    module, ready, extra = FAKES[kind]
    tmp = tmp_path_factory.mktemp(kind)
    port = procs.free_port()
    worker = procs.Proc([sys.executable, "-m", module, str(port)], tmp / "worker.log")
    started = [worker]
    try:
        worker.wait_http(f"http://127.0.0.1:{port}{ready}")
        gateway, url = procs.gateway(tmp, orjson.dumps({
            "server": {"timeouts": {"first_byte": 10, "idle": 5}}, "default_model": "m",
            "models": [{"name": "m", "backend": kind, **extra,
                        "upstreams": [f"http://127.0.0.1:{port}"]}]}).decode())
        started.append(gateway)
        yield kind, url
    finally:
        for p in reversed(started):
            p.stop()


def refused(exc: pytest.ExceptionInfo[BaseException], field: str) -> None:
    assert f"`{field}` is not supported by this model's worker" in str(exc.value)


def test_openai_chat(gw: tuple[str, str]) -> None:
    kind, url = gw
    oa = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
    whole = oa.chat.completions.create(model="m", messages=MSGS, max_tokens=4)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason == "length"
    assert whole.usage and whole.usage.completion_tokens == 4
    chunks = list(oa.chat.completions.create(model="m", messages=MSGS, max_tokens=4, stream=True,
                                             stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c for c in chunks if c.usage] == [chunks[-1]] and not chunks[-1].choices
    assert chunks[-1].usage and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    stopped = oa.chat.completions.create(model="m", messages=MSGS, stop=[text.split()[1]])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[:text.index(text.split()[1])]
    if "n" in CAN[kind]:
        two = oa.chat.completions.create(model="m", messages=MSGS, max_tokens=3, n=2)
        assert [c.index for c in two.choices] == [0, 1]
    else:
        with pytest.raises(openai.BadRequestError) as exc:
            list(oa.chat.completions.create(model="m", messages=MSGS, n=2, stream=True))
        refused(exc, "n")
    if "logprobs" in CAN[kind]:
        lp = oa.chat.completions.create(model="m", messages=MSGS, max_tokens=3, logprobs=True,
                                        top_logprobs=2)
        content = lp.choices[0].logprobs and lp.choices[0].logprobs.content
        assert content and len(content) == 3 and len(content[0].top_logprobs) == 2
    else:
        with pytest.raises(openai.BadRequestError) as exc:
            oa.chat.completions.create(model="m", messages=MSGS, logprobs=True)
        refused(exc, "logprobs")
    if "tools" in CAN[kind]:
        called = oa.chat.completions.create(model="m", messages=MSGS, tools=TOOLS)  # type: ignore[arg-type]
        calls = called.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_price"  # type: ignore[union-attr]
        assert called.choices[0].finish_reason == "tool_calls"
        streamed = list(oa.chat.completions.create(
            model="m", messages=MSGS, tools=TOOLS, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}))
        deltas = [t for c in streamed if c.choices for t in c.choices[0].delta.tool_calls or []]
        assert deltas[0].function and deltas[0].function.name == "get_price"
        assert orjson.loads("".join(d.function.arguments or "" for d in deltas if d.function))
        assert [c.choices[0].finish_reason for c in streamed
                if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
        assert streamed[-1].usage and streamed[-1].usage.completion_tokens > 0


def test_openai_completions(gw: tuple[str, str]) -> None:
    kind, url = gw
    oa = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
    whole = oa.completions.create(model="m", prompt="Hi", max_tokens=4)
    assert whole.choices[0].text and whole.choices[0].finish_reason == "length"
    assert whole.usage and whole.usage.completion_tokens == 4
    chunks = list(oa.completions.create(model="m", prompt="Hi", max_tokens=4, stream=True,
                                        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens == 4
    if "logprobs" in CAN[kind]:
        lp = oa.completions.create(model="m", prompt="Hi", max_tokens=3, logprobs=1, stream=True)
        assert all(c.choices[0].logprobs and c.choices[0].logprobs.tokens for c in lp
                   if c.choices and c.choices[0].text)
    else:
        with pytest.raises(openai.BadRequestError) as exc:
            oa.completions.create(model="m", prompt="Hi", logprobs=1)
        refused(exc, "logprobs")
    if "prompts" in CAN[kind]:
        two = oa.completions.create(model="m", prompt=["Hi", "Ho"], max_tokens=2)
        assert [c.index for c in two.choices] == [0, 1]
    else:
        with pytest.raises(openai.BadRequestError) as exc:
            oa.completions.create(model="m", prompt=["Hi", "Ho"], max_tokens=2)
        refused(exc, "prompt")


def test_huggingface_hub(gw: tuple[str, str]) -> None:
    kind, url = gw
    hf = InferenceClient(base_url=url, timeout=20)
    out = hf.text_generation("Hi", max_new_tokens=4, details=True, return_full_text=False)
    assert out.details and out.details.finish_reason == "length"
    assert out.details.generated_tokens == 4
    events = list(hf.text_generation("Hi", max_new_tokens=4, stream=True, details=True,
                                     return_full_text=False))
    assert events[-1].generated_text == out.generated_text and events[-1].details
    assert "".join(e.token.text for e in events) == out.generated_text
    if "prompt_logprobs" in CAN[kind]:
        dec = hf.text_generation("Hi", max_new_tokens=2, details=True, decoder_input_details=True)
        assert dec.details and dec.details.prefill
    else:
        with pytest.raises(hf_errors.ValidationError) as exc:
            hf.text_generation("Hi", max_new_tokens=2, details=True, decoder_input_details=True)
        refused(exc, "prompt_logprobs")
    chat = hf.chat_completion(MSGS, max_tokens=4)
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 4
    chunks = list(hf.chat_completion(MSGS, max_tokens=4, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        chat.choices[0].message.content


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # its own pydantic `.dict()` calls
def test_text_generation_client(gw: tuple[str, str]) -> None:
    """text-generation 0.7.0's Client (generate, generate_stream, chat). Its chat stream is
    left out: its pydantic ChoiceDelta requires `tool_calls`, which TGI's own text deltas
    (router/src/lib.rs TextMessage) never carry, and it json-parses `data: [DONE]`."""
    import text_generation as tg

    kind, url = gw
    client = tg.Client(url, timeout=20)
    out = client.generate("Hi", max_new_tokens=4)
    assert out.generated_text and out.details.generated_tokens == 4
    assert out.details.finish_reason == tg.types.FinishReason.Length
    events = list(client.generate_stream("Hi", max_new_tokens=4))
    assert events[-1].generated_text == out.generated_text
    assert events[-1].details and events[-1].details.generated_tokens == 4
    if kind == "triton":
        with pytest.raises(tg.errors.ValidationError) as exc:
            client.generate("Hi", max_new_tokens=4, best_of=2, do_sample=True)
        refused(exc, "n")
    else:
        best = client.generate("Hi", max_new_tokens=4, best_of=2, do_sample=True)
        assert best.details.best_of_sequences
    chat = client.chat(messages=[tg.types.Message(role="user", content="What is 6x7?")],
                       max_tokens=4)
    assert chat.choices[0].message.content and chat.choices[0].finish_reason == "length"


def test_elasticsearch_client(gw: tuple[str, str]) -> None:
    kind, url = gw
    es = Elasticsearch(url, request_timeout=20, max_retries=0)
    for path in ("/_inference/chat_completion/m/_unified", "/_inference/chat_completion/m/_stream"):
        body = es.perform_request("POST", path, headers=SSE, body={"messages": MSGS}).body
        events = [e for e in body.split("\n\n") if e]
        assert events[-1] == "event: message\ndata: [DONE]"
        chunks = [orjson.loads(e.split("data: ", 1)[1])["chat_completion"] for e in events[:-1]]
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c["choices"])
        assert chunks[-1]["usage"]["completion_tokens"] > 0
    if "tools" in CAN[kind]:
        called = es.perform_request("POST", "/_inference/chat_completion/m/_stream", headers=SSE,
                                    body={"messages": MSGS, "tools": TOOLS}).body
        assert '"tool_calls":[{"index":0' in called and '"name":"get_price"' in called
        assert '"finish_reason":"tool_calls"' in called
    completion = es.inference.completion(inference_id="m", input="Hi")
    assert completion.body["completion"][0]["result"]
    streamed = es.perform_request("POST", "/_inference/completion/m/_stream", headers=SSE,
                                  body={"input": "Hi"}).body
    deltas = [orjson.loads(e.split("data: ", 1)[1])["completion"][0]["delta"]
              for e in streamed.split("\n\n") if e and "[DONE]" not in e]
    assert "".join(deltas) == completion.body["completion"][0]["result"]
