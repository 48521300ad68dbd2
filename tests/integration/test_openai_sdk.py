"""The official openai SDK against a running gateway in front of the simulator worker.

The gateway and the simulator run as real processes on free loopback ports; the SDK is used
exactly as an application would, with only its base_url pointed at the gateway.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pydantic
import pytest

from tests.integration import procs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gateway_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("sdk")
    sim, sim_url = procs.simulator(tmp)
    gw, url = procs.gateway(tmp, f"""
server: {{timeouts: {{first_byte: 10, idle: 5}}, failover_attempts: 0}}  # in-band errors read here
default_model: demo
models:
  - name: demo
    aliases: [demo-alias]
    backend: vllm
    upstreams: [{sim_url}]
    upstream_model: org/demo-model
""")
    try:
        yield url
    finally:
        gw.stop()
        sim.stop()


@pytest.fixture
def client(gateway_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0,
                         timeout=20)


MSG = [{"role": "user", "content": "Tell me something"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def test_chat_whole(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="demo", messages=MSG, max_tokens=5)
    assert r.object == "chat.completion" and r.model == "demo"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5


def test_chat_stream_with_usage_matches_whole(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="demo", messages=MSG, max_tokens=6, seed=3)
    chunks = list(client.chat.completions.create(
        model="demo", messages=MSG, max_tokens=6, seed=3, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_continuous_usage_on_every_chunk(client: openai.OpenAI) -> None:
    """vLLM's `stream_options.continuous_usage_stats` (serving_chat.py
    include_continuous_usage): usage so far on every chunk, the prompt counted from the
    first, then the usual final usage chunk."""
    chunks = list(client.chat.completions.create(
        model="demo", messages=MSG, max_tokens=4, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == 4
    prompts = {c.usage.prompt_tokens for c in chunks if c.usage is not None}
    assert len(prompts) == 1 and prompts.pop() > 0
    assert not chunks[-1].choices


def test_chat_n2_and_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="demo-alias", messages=MSG, n=2, max_tokens=4,
                                       logprobs=True, top_logprobs=2, temperature=1.0)
    assert r.model == "demo-alias" and [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert c.logprobs is not None and c.logprobs.content is not None
        assert len(c.logprobs.content) == 4
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in c.logprobs.content)
        assert "".join(t.token for t in c.logprobs.content) == c.message.content
    stream = list(client.chat.completions.create(
        model="demo", messages=MSG, n=2, max_tokens=3, logprobs=True, top_logprobs=1,
        stream=True))
    by_choice: dict[int, str] = {0: "", 1: ""}
    for chunk in stream:
        for c in chunk.choices:
            by_choice[c.index] += c.delta.content or ""
            if c.delta.content:
                assert c.logprobs is not None and c.logprobs.content
    assert all(by_choice.values())


def test_chat_tools_whole_and_stream(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="demo", messages=MSG, tools=TOOLS,
                                       tool_choice="auto")
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    name, args, ids = "", "", set()
    finish = None
    for chunk in client.chat.completions.create(model="demo", messages=MSG, tools=TOOLS,
                                                stream=True):
        for c in chunk.choices:
            for t in c.delta.tool_calls or ():
                name += t.function.name or "" if t.function else ""
                args += t.function.arguments or "" if t.function else ""
                if t.id:
                    ids.add(t.id)
            finish = c.finish_reason or finish
    assert name == "get_weather" and json.loads(args) == json.loads(call.function.arguments)
    assert len(ids) == 1 and finish == "tool_calls"


def test_tool_result_message_reaches_the_worker(client: openai.OpenAI) -> None:
    history = [*MSG, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = client.chat.completions.create(model="demo", messages=history, max_tokens=3)
    assert r.choices[0].message.content


def test_reasoning_content(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "Think first [[sim reasoning]]"}]
    r = client.chat.completions.create(model="demo", messages=msgs, max_tokens=4)
    assert getattr(r.choices[0].message, "reasoning_content", None)
    seen = ""
    for chunk in client.chat.completions.create(model="demo", messages=msgs, max_tokens=4,
                                                stream=True):
        for c in chunk.choices:
            seen += getattr(c.delta, "reasoning_content", None) or ""
    assert seen == r.choices[0].message.reasoning_content


def test_completions_whole_stream_and_list_prompt(client: openai.OpenAI) -> None:
    r = client.completions.create(model="demo", prompt="Once upon", max_tokens=4, logprobs=1)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.choices[0].logprobs is not None and len(r.choices[0].logprobs.tokens) == 4
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="demo", prompt="Once upon", max_tokens=4, stream=True) if c.choices)
    assert text == r.choices[0].text
    many = client.completions.create(model="demo", prompt=["A b", "C d"], max_tokens=2, n=2)
    assert sorted(c.index for c in many.choices) == [0, 1, 2, 3]


def test_prompt_logprobs_reach_the_client_as_vllm_writes_them(client: openai.OpenAI) -> None:
    """vLLM's `prompt_logprobs` extra (CompletionResponseChoice): per prompt position null
    (the first) or {token id: {logprob, rank, decoded_token}}, with `prompt_token_ids` under
    `return_token_ids`."""
    r = client.completions.create(model="demo", prompt="Hello world", max_tokens=2,
                                  extra_body={"prompt_logprobs": 1, "return_token_ids": True})
    choice = r.choices[0].model_dump()
    plp, ids = choice["prompt_logprobs"], choice["prompt_token_ids"]
    assert plp[0] is None and len(plp) == len(ids) > 1
    for pos, entry in enumerate(plp[1:], 1):
        own = entry[str(ids[pos])]
        assert set(own) == {"logprob", "rank", "decoded_token"} and own["logprob"] <= 0
    # chat: at the top of the response (ChatCompletionResponse.prompt_logprobs)
    chat = client.chat.completions.create(model="demo", messages=MSG, max_tokens=2,
                                          extra_body={"prompt_logprobs": 1}).model_dump()
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) > 1
    assert all(set(e) and all(set(v) == {"logprob", "rank", "decoded_token"}
                              for v in e.values()) for e in chat["prompt_logprobs"][1:])


def test_stop_string_is_not_in_the_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="demo", messages=MSG, max_tokens=8, seed=1)
    words = whole.choices[0].message.content.split()
    stop = words[2]
    r = client.chat.completions.create(model="demo", messages=MSG, max_tokens=8, seed=1,
                                       stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].message.content


def test_models_and_errors(client: openai.OpenAI) -> None:
    assert {"demo", "demo-alias"} <= {m.id for m in client.models.list()}
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="nope", messages=MSG)
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="demo", messages=MSG, temperature=9)
    assert bad.value.param == "temperature"


def test_models_retrieve_and_request_ids_on_every_route(client: openai.OpenAI) -> None:
    """openai-python `models.retrieve` GETs /v1/models/{model} (the name percent-encoded,
    openai/_utils/_path.py path_template); OpenAI answers one model object, a 404
    `model_not_found` for an unknown one. SPEC.md: every request's id is echoed as
    `x-request-id`, so `with_raw_response` shows it on the status routes too."""
    assert client.models.retrieve("demo-alias").id == "demo-alias"
    with pytest.raises(openai.NotFoundError) as nf:
        client.models.retrieve("org/unknown")
    assert (nf.value.code, nf.value.param) == ("model_not_found", "model")
    assert "org/unknown" in nf.value.message
    raw = client.models.with_raw_response.list(extra_headers={"x-request-id": "req-models"})
    assert raw.headers["x-request-id"] == "req-models"
    assert {m.id for m in raw.parse()} >= {"demo", "demo-alias"}
    chat = client.chat.completions.with_raw_response.create(
        model="demo", messages=MSG, max_tokens=2, extra_headers={"x-request-id": "req-chat"})
    assert chat.headers["x-request-id"] == "req-chat" and chat.parse().choices
    own = client.with_options(max_retries=0).get("/models", cast_to=httpx.Response)
    assert len(own.headers["x-request-id"]) == 32  # made by the gateway when none came
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="demo", input="x")
    assert missing.value.response.headers["x-request-id"]


class Weather(pydantic.BaseModel):
    city: str
    temp: int


def test_tool_choice_required_and_named_accumulated_the_sdk_way(client: openai.OpenAI) -> None:
    """vLLM's tool_choice "required" and a named function (serving_chat.py: a guided-decoded
    call of that function), streamed as tool-call deltas that openai-python's stream helper
    (lib/streaming/chat/_completions.py) accumulates per choice and index."""
    tools = [*TOOLS, openai.pydantic_function_tool(Weather)]
    required = client.chat.completions.create(model="demo", messages=MSG, tools=tools,
                                              tool_choice="required")
    assert required.choices[0].message.tool_calls
    named = {"type": "function", "function": {"name": "Weather"}}
    with client.chat.completions.stream(model="demo", messages=MSG, tools=tools,
                                        tool_choice=named, n=2,  # type: ignore[arg-type]
                                        max_completion_tokens=64) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds
    assert [c.index for c in final.choices] == [0, 1]
    for c in final.choices:
        call = c.message.tool_calls[0]  # type: ignore[index]
        assert call.function.name == "Weather" and call.id
        assert isinstance(call.function.parsed_arguments, Weather)
        assert c.finish_reason == "tool_calls"


def test_structured_output_parse_sync_beta_and_async(client: openai.OpenAI,
                                                     gateway_url: str) -> None:
    """response_format json_schema from a pydantic model (`chat.completions.parse`, its
    `beta` alias and the async stream helper): the worker's guided JSON parses as the model."""
    r = client.chat.completions.parse(model="demo", messages=MSG, response_format=Weather, n=2)
    assert all(isinstance(c.message.parsed, Weather) for c in r.choices)
    beta = client.beta.chat.completions.parse(model="demo", messages=MSG,
                                              response_format=Weather)
    assert beta.choices[0].message.parsed == r.choices[0].message.parsed

    async def run() -> None:
        aclient = openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="unused",
                                     max_retries=0, timeout=20)
        async with aclient.chat.completions.stream(
                model="demo", messages=MSG, response_format=Weather,
                stream_options={"include_usage": True}) as stream:
            async for _ in stream:
                pass
            done = await stream.get_final_completion()
        assert isinstance(done.choices[0].message.parsed, Weather)
        assert done.usage is not None and done.usage.completion_tokens > 0
        with pytest.raises(openai.APIError, match="Simulated engine error"):
            async for _ in await aclient.chat.completions.create(
                    model="demo", stream=True, max_tokens=9,
                    messages=[{"role": "user", "content": "x [[sim error_after=2]]"}]):
                pass
        await aclient.close()

    asyncio.run(run())


def test_completions_token_ids_and_usage_chunk(client: openai.OpenAI) -> None:
    """Token-id prompts (one and several) and the completions usage chunk (empty
    `choices`, vLLM serving_completion.py) with `max_completion_tokens`' sibling max_tokens."""
    one = client.completions.create(model="demo", prompt=[1005, 1197], max_tokens=3)
    assert one.choices[0].text and one.usage is not None and one.usage.prompt_tokens == 2
    many = client.completions.create(model="demo", prompt=[[1005, 1197], [1222]], max_tokens=2)
    assert [c.index for c in many.choices] == [0, 1]
    chunks = list(client.completions.create(model="demo", prompt="Once", max_tokens=3,
                                            n=2, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])
    chat = client.chat.completions.create(model="demo", messages=MSG, max_completion_tokens=3)
    assert chat.usage is not None and chat.usage.completion_tokens == 3


def test_mid_stream_failure_raises_in_the_sdk(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "go [[sim drop_after=3]]"}]
    got = ""
    with pytest.raises(openai.APIError) as err:
        for chunk in client.chat.completions.create(model="demo", messages=msgs,
                                                    max_tokens=20, stream=True):
            got += "".join(c.delta.content or "" for c in chunk.choices)
    assert got  # some tokens arrived before the failure
    assert "broke off" in str(err.value) or "ended before" in str(err.value)


def test_worker_in_band_error_raises_in_the_sdk(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "go [[sim error_after=2]]"}]
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(model="demo", messages=msgs, max_tokens=20,
                                                stream=True):
            pass


def _write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p
