"""The triton worker protocol end to end: the real gateway app, the official OpenAI SDK as the
client, and a Triton + TensorRT-LLM ensemble fake (tests/fakes/triton_fake.py) as the worker —
in-process for most cases, and as real processes on loopback ports for the transport ones
(a connection cut mid-stream)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import orjson
import pytest
from starlette.applications import Starlette

from gateway import config
from tests.fakes import hosts, triton_fake
from tests.integration import procs

TEMPLATE = (Path(__file__).parents[1] / "golden" / "triton" / "chat_template.jinja").read_text()
MSG: Any = [{"role": "user", "content": "What is the answer?"}]


def make_config(template: str | None = TEMPLATE, upstreams: tuple[str, ...] = (
        "http://triton:8000",)) -> config.Config:
    return config.Config.model_validate({
        "server": {"timeouts": {"first_byte": 5, "idle": 5}}, "default_model": "llama",
        "models": [{"name": "llama", "backend": "triton", "upstreams": list(upstreams),
                    "upstream_model": "ensemble", "chat_template": template,
                    "routing": "round_robin"}]})  # tests read which upstream goes first


@pytest.fixture
def fake() -> Starlette:
    return triton_fake.app()


@pytest.fixture
async def gw(fake: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with hosts.serve(make_config(), {"triton": fake}) as client:
        yield client


sdk = hosts.sdk
sent = hosts.sent


@pytest.mark.anyio
async def test_chat_whole_through_the_sdk_cuts_the_stop_word(gw: httpx.AsyncClient,
                                                             fake: Starlette) -> None:
    r = await sdk(gw).chat.completions.create(model="llama", messages=MSG, stop=["."])
    assert r.choices[0].message.content == " The answer is 42"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 5)
    path, body = sent(fake)
    assert path == "/v2/models/ensemble/generate" and body["stop_words"] == ["."]
    assert body["text_input"].endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.anyio
async def test_chat_stream_through_the_sdk(gw: httpx.AsyncClient, fake: Starlette) -> None:
    stream = await sdk(gw).chat.completions.create(
        model="llama", messages=MSG, stream=True, max_tokens=3,
        stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " The answer is"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert sent(fake)[0] == "/v2/models/ensemble/generate_stream"


@pytest.mark.anyio
async def test_completions_whole_and_stream_through_the_sdk(gw: httpx.AsyncClient) -> None:
    client = sdk(gw)
    r = await client.completions.create(model="llama", prompt="Q: answer?\nA:", stop="\n",
                                        max_tokens=20)
    assert r.choices[0].text == " The answer is 42." and r.choices[0].finish_reason == "stop"
    stream = await client.completions.create(model="llama", prompt="Q:", stream=True)
    parts = [c async for c in stream]
    assert "".join(c.choices[0].text for c in parts if c.choices) == " The answer is 42.\n Ask again!"
    assert [c.choices[0].finish_reason for c in parts if c.choices][-1] == "stop"


@pytest.mark.anyio
async def test_chat_without_a_template_is_a_400_naming_chat_template(fake: Starlette) -> None:
    async with hosts.serve(make_config(template=None), {"triton": fake}) as client:
        with pytest.raises(openai.BadRequestError) as exc:
            await sdk(client).chat.completions.create(model="llama", messages=MSG)
    assert exc.value.status_code == 400 and "chat_template" in exc.value.message
    assert cast(dict[str, Any], exc.value.body)["param"] == "chat_template"
    assert fake.state.requests == []  # refused before any byte went upstream


@pytest.mark.anyio
async def test_a_refused_parameter_is_a_400_naming_it(gw: httpx.AsyncClient,
                                                      fake: Starlette) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        await sdk(gw).chat.completions.create(model="llama", messages=MSG, n=2)
    assert cast(dict[str, Any], exc.value.body)["param"] == "n"
    assert fake.state.requests == []


@pytest.mark.anyio
async def test_an_error_mid_stream_ends_with_the_clients_in_band_error(
        gw: httpx.AsyncClient) -> None:
    msgs: Any = [{"role": "user", "content": "Hi [[error_after=2]]"}]
    stream = await sdk(gw).chat.completions.create(model="llama", messages=msgs, stream=True)
    got = []
    with pytest.raises(openai.APIError, match="Executor failed"):
        async for c in stream:
            got.append(c.choices[0].delta.content if c.choices else None)
    assert " The" in got


@pytest.mark.anyio
async def test_a_worker_refusal_before_the_first_byte_passes_its_status(
        gw: httpx.AsyncClient) -> None:
    r = await gw.post("/v1/completions", json={"model": "llama", "prompt": "x [[fail=400]]"})
    assert r.status_code == 400 and "failed before inference" in r.json()["error"]["message"]


@pytest.mark.anyio
async def test_a_stream_whose_first_response_fails_passes_its_status(
        gw: httpx.AsyncClient, fake: Starlette) -> None:
    """Triton writes a stream's first-response error SSE-framed, under the error's status
    (src/http_server.cc GenerateRequestClass::InferResponseComplete, AddErrorJson)."""
    r = await gw.post("/v1/completions", json={"model": "llama", "prompt": "x [[fail=400]]",
                                               "stream": True})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "the model failed before inference"
    assert len(fake.state.requests) == 1


@pytest.mark.anyio
async def test_an_unknown_model_on_the_worker_is_retried_then_503(fake: Starlette) -> None:
    cfg = config.Config.model_validate({"default_model": "llama", "models": [{
        "name": "llama", "backend": "triton", "upstreams": ["http://triton:8000"],
        "upstream_model": "not-there"}]})
    async with hosts.serve(cfg, {"triton": fake}) as client:
        r = await client.post("/v1/completions", json={"model": "llama", "prompt": "x"})
    assert r.status_code == 503 and len(fake.state.requests) == 3


@pytest.mark.anyio
async def test_tgi_clients_get_the_stop_sequence_back_once(gw: httpx.AsyncClient) -> None:
    """TGI keeps the matched stop sequence; the TGI front end asks the worker to keep it too."""
    r = await gw.post("/generate", json={"inputs": "Hi", "parameters": {"stop": ["42"]}})
    assert r.status_code == 200 and r.json() == {"generated_text": " The answer is 42"}


@pytest.mark.anyio
async def test_tgi_details_list_the_tokens_of_the_workers_stream(gw: httpx.AsyncClient,
                                                                 fake: Starlette) -> None:
    """TGI's details list every generated token (router/src/lib.rs `Details.tokens`); the
    ensemble's `generate` body is one `text_output` (tensorrt_llm/1/model.py convert_response),
    so the answer is asked of `generate_stream`, one response per token, and folded: ids -1 and
    null log probs as on the stream (SPEC.md), `generated_tokens` their count."""
    r = await gw.post("/generate", json={"inputs": "Hi", "parameters": {
        "details": True, "max_new_tokens": 3, "stop": ["42"]}})
    assert r.status_code == 200
    assert sent(fake)[0] == "/v2/models/ensemble/generate_stream"
    details = r.json()["details"]
    assert r.json()["generated_text"] == " The answer is"
    assert (details["finish_reason"], details["generated_tokens"]) == ("length", 3)
    assert details["tokens"] == [{"id": -1, "text": t, "logprob": None, "special": False}
                                 for t in (" The", " answer", " is")]
    lmi = await gw.post("/invocations", json={"inputs": "Hi", "parameters": {
        "details": True, "max_new_tokens": 2}})
    assert lmi.json()["details"]["tokens"] == [{"id": -1, "text": t, "log_prob": None}
                                               for t in (" The", " answer")]
    plain = await gw.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
    assert plain.json() == {"generated_text": " The answer"}
    assert sent(fake)[0] == "/v2/models/ensemble/generate"  # no details: one body, as before


# ---- real processes: the fake worker and the gateway on loopback ports ----


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("triton")
    port = procs.free_port()
    worker = procs.Proc([sys.executable, "-m", "tests.fakes.triton_fake", str(port)],
                        tmp / "triton.log")
    gateway: procs.Proc | None = None
    try:
        worker.wait_http(f"http://127.0.0.1:{port}/v2/health/ready")
        (tmp / "t.jinja").write_text(TEMPLATE)
        gateway, url = procs.gateway(tmp, orjson.dumps({
            "server": {"timeouts": {"first_byte": 5, "idle": 5}}, "default_model": "llama",
            "models": [{"name": "llama", "backend": "triton", "upstreams": [
                f"http://127.0.0.1:{port}"], "upstream_model": "ensemble",
                "chat_template": str(tmp / "t.jinja")}]}).decode())
        yield url
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()


@pytest.mark.integration
def test_live_stream_over_real_http(live: str) -> None:
    client: Any = openai.OpenAI(base_url=live + "/v1", api_key="k", max_retries=0, timeout=10)
    chunks = list(client.chat.completions.create(model="llama", messages=MSG, stream=True,
                                                 stop=["\n"]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == " The answer is 42."
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.integration
def test_live_connection_cut_mid_stream_is_an_in_band_error(live: str) -> None:
    client: Any = openai.OpenAI(base_url=live + "/v1", api_key="k", max_retries=0, timeout=10)
    msgs: Any = [{"role": "user", "content": "Hi [[drop_after=3]]"}]
    stream = client.chat.completions.create(model="llama", messages=msgs, stream=True)
    with pytest.raises(openai.APIError, match="broke off"):
        for _ in stream:
            pass


@pytest.mark.anyio
async def test_a_legacy_ensemble_stream_is_whole_up_to_the_limit() -> None:
    """A 2024-era ensemble (triton_fake "legacy": its docs' recorded generate_stream answers)
    returns no `num_output_tokens` and the `output_log_probs` of the whole sequence so far on
    each response: the answer reaches `max_tokens` whole and ends as `length` there."""
    fake = triton_fake.app("legacy")
    async with hosts.serve(make_config(), {"triton": fake}) as gw:
        stream = await sdk(gw).completions.create(model="llama", prompt="Q:", max_tokens=6,
                                                  stream=True)
        chunks = [c async for c in stream]
        whole = await sdk(gw).completions.create(model="llama", prompt="Q:", max_tokens=6)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "".join(
        triton_fake.SCRIPT[:6])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert whole.choices[0].text == "".join(triton_fake.SCRIPT[:6])
    assert whole.choices[0].finish_reason == "length"
