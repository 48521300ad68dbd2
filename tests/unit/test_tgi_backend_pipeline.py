"""The tgi worker protocol end to end: the real gateway app, the official OpenAI SDK (and TGI's
own wire format) as the client, a TGI fake (tests/fakes/tgi_fake.py, which validates as TGI's
validation.rs does) as the worker — in-process, and as real processes on loopback ports for a
connection cut mid-stream."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from starlette.applications import Starlette

from gateway import config
from tests.fakes import hosts, tgi_fake
from tests.integration import procs

MSG: Any = [{"role": "user", "content": "What is the answer?"}]


def make_config(upstreams: tuple[str, ...] = ("http://tgi:8080",)) -> config.Config:
    return config.Config.model_validate({
        "server": {"timeouts": {"first_byte": 5, "idle": 5}}, "default_model": "llama",
        "models": [{"name": "llama", "backend": "tgi", "upstreams": list(upstreams),
                    "routing": "round_robin"}]})  # tests read which upstream goes first


@pytest.fixture
def fake() -> Starlette:
    return tgi_fake.app()


@pytest.fixture
async def gw(fake: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with hosts.serve(make_config(), {"tgi": fake}) as client:
        yield client


sdk = hosts.sdk
sent = hosts.sent


@pytest.mark.anyio
async def test_chat_whole_greedy_and_no_nucleus_cut_are_translated(
        gw: httpx.AsyncClient, fake: Starlette) -> None:
    """The fake refuses top_p 1.0 as TGI does; the gateway leaves it out."""
    r = await sdk(gw).chat.completions.create(model="llama", messages=MSG, stop=["."],
                                              temperature=0, top_p=1.0)
    assert r.choices[0].message.content == " The answer is 42"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens == 5
    path, body = sent(fake)
    assert path == "/v1/chat/completions" and body["model"] == "tgi" and "top_p" not in body


@pytest.mark.anyio
async def test_chat_stream_through_the_sdk(gw: httpx.AsyncClient) -> None:
    stream = await sdk(gw).chat.completions.create(
        model="llama", messages=MSG, stream=True, stop=["42"],
        stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        " The answer is "
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


@pytest.mark.anyio
async def test_chat_tool_call_through_the_sdk(gw: httpx.AsyncClient) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    r = await sdk(gw).chat.completions.create(model="llama", messages=MSG, tools=tools)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and orjson.loads(call.function.arguments) == {
        "city": "Paris"}
    assert r.choices[0].finish_reason == "tool_calls"


@pytest.mark.anyio
async def test_completions_stream_with_logprobs_from_tgi_tokens(
        gw: httpx.AsyncClient, fake: Starlette) -> None:
    stream = await sdk(gw).completions.create(model="llama", prompt="Q:", stream=True,
                                              logprobs=2, max_tokens=3)
    parts = [c async for c in stream]
    texts = [c.choices[0].text for c in parts if c.choices]
    assert "".join(texts) == " The answer is"
    lps = [c.choices[0].logprobs for c in parts if c.choices and c.choices[0].logprobs]
    assert lps[0].tokens == [" The"] and lps[0].token_logprobs == [-0.5]
    assert sent(fake)[1]["parameters"]["top_n_tokens"] == 2


@pytest.mark.anyio
async def test_completions_whole_reads_the_stream_for_usage(gw: httpx.AsyncClient,
                                                            fake: Starlette) -> None:
    r = await sdk(gw).completions.create(model="llama", prompt="a b c", max_tokens=2)
    assert r.choices[0].text == " The answer" and r.choices[0].finish_reason == "length"
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 2)
    assert sent(fake)[0] == "/generate_stream"


@pytest.mark.anyio
async def test_a_worker_validation_error_is_a_4xx_never_retried(gw: httpx.AsyncClient,
                                                                fake: Starlette) -> None:
    # validation.rs validate_input checks at most 1024 new tokens (DEFAULT_GENERATION_LENGTH),
    # so it is the long prompt that passes max_total_tokens (4096) here.
    r = await gw.post("/v1/completions", json={"model": "llama", "prompt": "w " * 3100,
                                                "max_tokens": 5000})
    assert r.status_code == 422 and "`max_new_tokens` must be <=" in r.json()["error"]["message"]
    assert len(fake.state.requests) == 1


@pytest.mark.anyio
async def test_an_overloaded_worker_is_replaced_by_another(fake: Starlette) -> None:
    """TGI says "overloaded" inside a 200 stream (server.rs); another upstream serves it."""
    busy = tgi_fake.app(overloaded=True)
    cfg = make_config(("http://busy:8080", "http://tgi:8080"))
    async with hosts.serve(cfg, {"busy": busy, "tgi": fake}) as client:
        replies = [await client.post("/v1/completions", json={"model": "llama", "prompt": "Hi"})
                   for _ in range(2)]
    assert [r.status_code for r in replies] == [200, 200]
    assert len(busy.state.requests) >= 1 and len(fake.state.requests) == 2


@pytest.mark.anyio
async def test_tgi_clients_get_tgis_own_stream_back(gw: httpx.AsyncClient) -> None:
    r = await gw.post("/generate_stream", json={"inputs": "Hi", "parameters": {
        "details": True, "stop": ["42"], "max_new_tokens": 10}})
    events = [orjson.loads(line[6:]) for line in r.text.split("\n\n") if line]
    assert [e["token"]["id"] for e in events] == [415, 4372, 349, 28705]
    assert events[-1]["generated_text"] == " The answer is 42"
    assert events[-1]["details"] == {"finish_reason": "stop_sequence", "generated_tokens": 4,
                                     "seed": None, "input_length": 1}


@pytest.mark.anyio
async def test_a_drawn_seed_reaches_the_worker_and_the_details(gw: httpx.AsyncClient,
                                                               fake: Starlette) -> None:
    """validation.rs draws a seed for a request without one; the shard reports it when it
    samples (flash_causal_lm.py generate_token: `seed if do_sample else None`)."""
    r = await gw.post("/generate", json={"inputs": "Hi", "parameters": {
        "do_sample": True, "details": True, "max_new_tokens": 2}})
    seed = sent(fake)[1]["parameters"]["seed"]
    assert isinstance(seed, int) and r.json()["details"]["seed"] == seed


@pytest.mark.anyio
async def test_an_error_mid_stream_is_the_clients_in_band_error(gw: httpx.AsyncClient) -> None:
    stream = await sdk(gw).completions.create(model="llama", prompt="Hi [[error_after=2]]",
                                              stream=True)
    with pytest.raises(openai.APIError, match="during generation"):
        async for _ in stream:
            pass


# ---- real processes ----


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("tgi")
    port = procs.free_port()
    worker = procs.Proc([sys.executable, "-m", "tests.fakes.tgi_fake", str(port)],
                        tmp / "tgi.log")
    gateway: procs.Proc | None = None
    try:
        worker.wait_http(f"http://127.0.0.1:{port}/health")
        gateway, url = procs.gateway(tmp, orjson.dumps({
            "server": {"timeouts": {"first_byte": 5, "idle": 5}}, "default_model": "llama",
            "models": [{"name": "llama", "backend": "tgi",
                        "upstreams": [f"http://127.0.0.1:{port}"]}]}).decode())
        yield url
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()


@pytest.mark.integration
def test_live_chat_stream_over_real_http(live: str) -> None:
    client: Any = openai.OpenAI(base_url=live + "/v1", api_key="k", max_retries=0, timeout=10)
    chunks = list(client.chat.completions.create(model="llama", messages=MSG, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        " The answer is 42.\n Ask again!"
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.integration
def test_live_connection_cut_mid_stream_is_an_in_band_error(live: str) -> None:
    client: Any = openai.OpenAI(base_url=live + "/v1", api_key="k", max_retries=0, timeout=10)
    msgs: Any = [{"role": "user", "content": "Hi [[drop_after=3]]"}]
    with pytest.raises(openai.APIError, match="broke off"):
        for _ in client.chat.completions.create(model="llama", messages=msgs, stream=True):
            pass


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_an_empty_prompt_is_an_openai_400_before_any_worker_request(
        gw: httpx.AsyncClient, fake: Starlette, stream: bool) -> None:
    """TGI refuses an empty prompt whatever the model (router/src/validation.rs:
    `ValidationError::EmptyInput`, "`inputs` cannot be empty", a 422): an OpenAI client asked
    what this worker cannot do, so it gets OpenAI's 400 naming `prompt`, not TGI's 422, and
    the worker is not asked."""
    with pytest.raises(openai.BadRequestError) as info:
        await sdk(gw).completions.create(model="llama", prompt="", max_tokens=3, stream=stream)
    assert info.value.status_code == 400
    assert info.value.body["message"] == (  # type: ignore[index]
        "`prompt` is not supported by this model's worker (tgi): TGI refuses an empty "
        "prompt (validation.rs: `inputs` cannot be empty)")
    assert fake.state.requests == []
