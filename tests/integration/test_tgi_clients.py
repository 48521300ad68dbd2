"""TGI's own Python clients, unchanged, against a running gateway in front of the simulator.

huggingface_hub's InferenceClient with only `base_url` set: text_generation posts TGI's compat
route (POST /) and chat_completion posts /v1/chat/completions with model "dummy".
text_generation's Client (0.7.0) posts / and /v1/chat/completions with model "tgi"; it pins
huggingface-hub<1.0, which the InferenceClient tests cannot have, so the test command installs
it with --no-deps (it imports nothing huggingface_hub 1.x lacks).
The simulator's /_sim/last_request shows the vLLM request each call became.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from huggingface_hub import AsyncInferenceClient, InferenceClient
from huggingface_hub import errors as hf_errors

from tests.integration import procs

pytestmark = pytest.mark.integration

PROMPT = "What is Deep Learning?"
MSGS = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("tgi")
    sim, sim_url = procs.simulator(tmp, "--tokens", "8")
    gw, url = procs.gateway(tmp, f"""
server: {{timeouts: {{first_byte: 10, idle: 5}}, failover_attempts: 0}}  # in-band errors read here
default_model: demo
models:
  - name: demo
    backend: vllm
    upstreams: [{sim_url}]
    upstream_model: org/demo-model
""")
    try:
        yield url, sim_url
    finally:
        gw.stop()
        sim.stop()


@pytest.fixture
def hf(urls: tuple[str, str]) -> InferenceClient:
    return InferenceClient(base_url=urls[0], timeout=20)


def last_upstream(urls: tuple[str, str]) -> dict[str, Any]:
    seen: dict[str, Any] = httpx.get(urls[1] + "/_sim/last_request", timeout=5).json()
    return seen


def test_text_generation_plain_and_details(hf: InferenceClient,
                                           urls: tuple[str, str]) -> None:
    text = hf.text_generation(PROMPT, max_new_tokens=5)
    # TGI's POST / returns the full text when the client sets no return_full_text (server.rs
    # compat_generate, pipeline tag text-generation).
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)
    sent = last_upstream(urls)
    assert sent["path"] == "/v1/completions"
    assert sent["body"]["prompt"] == PROMPT and sent["body"]["max_tokens"] == 5
    assert sent["body"]["temperature"] == 0.0  # parameters sent, no do_sample: greedy
    out = hf.text_generation(PROMPT, max_new_tokens=5, details=True, return_full_text=False)
    assert out.details is not None
    assert out.details.finish_reason == "length" and out.details.generated_tokens == 5
    assert [t.text for t in out.details.tokens] and all(
        isinstance(t.id, int) and t.logprob <= 0 for t in out.details.tokens)
    assert out.generated_text == "".join(t.text for t in out.details.tokens)
    assert text == PROMPT + out.generated_text
    body = last_upstream(urls)["body"]
    assert body["return_token_ids"] is True and body["logprobs"] == 0


def test_text_generation_stream_and_stream_with_details(hf: InferenceClient) -> None:
    whole = hf.text_generation(PROMPT, max_new_tokens=6, return_full_text=False)
    pieces = list(hf.text_generation(PROMPT, max_new_tokens=6, stream=True))
    assert all(isinstance(p, str) for p in pieces) and "".join(pieces) == whole
    events = list(hf.text_generation(PROMPT, max_new_tokens=6, stream=True, details=True,
                                     return_full_text=False))
    assert len(events) == 6
    assert all(e.details is None and e.generated_text is None for e in events[:-1])
    last = events[-1]
    assert last.generated_text == whole and last.details is not None
    assert last.details.finish_reason == "length" and last.details.generated_tokens == 6
    assert "".join(e.token.text for e in events) == whole


def test_eos_stop_sequence_sampling_and_prefill(hf: InferenceClient,
                                                urls: tuple[str, str]) -> None:
    out = hf.text_generation(PROMPT, details=True, return_full_text=False)  # 8 tokens then EOS
    assert out.details is not None and out.details.finish_reason == "eos_token"
    assert out.details.generated_tokens == 9  # the EOS token counts, as in TGI
    stop = out.generated_text.split()[2]
    cut = hf.text_generation(PROMPT, details=True, stop=[stop], return_full_text=False)
    assert cut.details is not None and cut.details.finish_reason == "stop_sequence"
    assert cut.generated_text.endswith(stop)  # TGI keeps the stop sequence
    assert last_upstream(urls)["body"]["include_stop_str_in_output"] is True
    sampled = hf.text_generation(PROMPT, max_new_tokens=3, do_sample=True, seed=5,
                                 temperature=0.7, top_k=20, top_p=0.9, details=True)
    assert sampled.details is not None and sampled.details.seed == 5
    body = last_upstream(urls)["body"]
    assert (body["seed"], body["temperature"], body["top_k"], body["top_p"]) == (5, 0.7, 20, 0.9)
    pre = hf.text_generation(PROMPT, max_new_tokens=2, details=True, decoder_input_details=True)
    assert pre.details is not None and [t.id for t in pre.details.prefill][0] == 1  # BOS
    assert last_upstream(urls)["body"]["prompt_logprobs"] == 1


def test_errors_raise_tgi_typed_exceptions(hf: InferenceClient) -> None:
    with pytest.raises(hf_errors.ValidationError, match="`temperature` must be strictly"):
        hf.text_generation(PROMPT, temperature=0.0)
    with pytest.raises(hf_errors.ValidationError, match="`top_p` must be > 0.0 and < 1.0"):
        list(hf.text_generation(PROMPT, top_p=1.0, stream=True))
    with pytest.raises(hf_errors.GenerationError, match="Simulated engine error"):
        list(hf.text_generation(PROMPT + " [[sim error_after=2]]", stream=True))


def test_chat_completion_whole_and_stream(hf: InferenceClient, urls: tuple[str, str]) -> None:
    whole = hf.chat_completion(MSGS, max_tokens=5)
    assert whole.model == "demo" and whole.system_fingerprint == "3.3.7-native"
    assert whole.choices[0].message.content and whole.choices[0].finish_reason == "length"
    sent = last_upstream(urls)
    assert sent["path"] == "/v1/chat/completions" and sent["body"]["model"] == "org/demo-model"
    chunks = list(hf.chat_completion(MSGS, max_tokens=5, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_info_and_health(urls: tuple[str, str]) -> None:
    info = httpx.get(urls[0] + "/info", timeout=5).json()
    assert info["model_id"] == "org/demo-model" and info["max_best_of"] == 2
    for path in ("/health", "/"):
        r = httpx.get(urls[0] + path, timeout=5)
        assert (r.status_code, r.content) == (200, b"")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # its own pydantic `.dict()` calls
def test_text_generation_client(urls: tuple[str, str]) -> None:
    import text_generation as tg  # installed by the test command (--no-deps), see above

    client = tg.Client(urls[0], timeout=20)
    out = client.generate(PROMPT, max_new_tokens=4)
    assert out.details.generated_tokens == 4 and out.details.finish_reason == "length"
    streamed = list(client.generate_stream(PROMPT, max_new_tokens=4))
    assert streamed[-1].generated_text == out.generated_text
    assert "".join(r.token.text for r in streamed) == out.generated_text
    assert last_upstream(urls)["body"]["prompt"] == PROMPT
    with pytest.raises(tg.errors.ValidationError, match="`typical_p` is not supported"):
        client.generate(PROMPT, typical_p=0.5)  # valid to TGI, not to a vLLM worker
    message = tg.types.Message(role="user", content=PROMPT)
    chat = client.chat(messages=[message], max_tokens=4)
    assert chat.system_fingerprint == "3.3.7-native" and chat.choices[0].message.content
    assert last_upstream(urls)["body"]["model"] == "org/demo-model"
    # Its streaming chat is not checked: text_generation 0.7.0 json.loads the terminator
    # `data: [DONE]` that TGI itself writes and fails on it, and its ChoiceDelta wants a
    # `tool_calls: null` that TGI 3 does not write (and Elasticsearch's parser refuses).


def test_chat_history_with_tool_call_arguments_as_an_object(hf: InferenceClient,
                                                            urls: tuple[str, str]) -> None:
    """TGI reads a tool call's `arguments` (alias `parameters`) as any JSON value
    (huggingface/text-generation-inference router/src/lib.rs FunctionDefinition,
    `arguments: serde_json::Value`, written back as its JSON text by `serialize_as_string`);
    huggingface_hub types it `Any`. The worker gets OpenAI's JSON string."""
    history = [*MSGS,
               {"role": "assistant", "tool_calls": [{"id": "0", "type": "function", "function": {
                   "name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {
                   "name": "get_weather", "parameters": {"city": "Rome"}}}]},
               {"role": "tool", "tool_call_id": "0", "content": "sunny"}]
    out = hf.chat_completion(history, max_tokens=2)
    assert out.choices[0].message.content
    sent = last_upstream(urls)["body"]["messages"]
    assert sent[1]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                    "arguments": '{"city":"Paris"}'}
    assert sent[2]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                    "arguments": '{"city":"Rome"}'}


JSON_A = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def test_text_generation_best_of_top_tokens_and_grammar(hf: InferenceClient,
                                                        urls: tuple[str, str]) -> None:
    """TGI's `best_of` (details.best_of_sequences), `top_n_tokens` (details.top_tokens and each
    stream event's top_tokens, the chosen token first) and `grammar` (lib.rs GrammarType,
    `{"type": "json", "value": schema}` / `regex`) through huggingface_hub."""
    best = hf.text_generation(PROMPT, max_new_tokens=3, best_of=2, do_sample=True, details=True,
                              return_full_text=False)
    assert best.details is not None and best.details.best_of_sequences is not None
    assert len(best.details.best_of_sequences) == 1
    other = best.details.best_of_sequences[0]
    assert other.generated_tokens == 3 and other.generated_text
    top = hf.text_generation(PROMPT, max_new_tokens=2, details=True, top_n_tokens=2,
                             return_full_text=False)
    assert top.details is not None and top.details.top_tokens is not None
    assert [len(t) for t in top.details.top_tokens] == [2, 2]
    assert [t[0]["text"] for t in top.details.top_tokens] == [
        t.text for t in top.details.tokens]
    events = list(hf.text_generation(PROMPT, max_new_tokens=2, stream=True, details=True,
                                     top_n_tokens=2))
    assert all(e.top_tokens and e.top_tokens[0].text == e.token.text for e in events)
    shaped = hf.text_generation(PROMPT, max_new_tokens=40, return_full_text=False,
                                grammar={"type": "json", "value": JSON_A})
    assert isinstance(json.loads(shaped)["a"], int)
    assert last_upstream(urls)["body"]["response_format"]["json_schema"]["schema"] == JSON_A
    digits = hf.text_generation(PROMPT, max_new_tokens=5, return_full_text=False,
                                grammar={"type": "regex", "value": "[0-9]+"})
    assert digits and last_upstream(urls)["body"]["structured_outputs"] == {"regex": "[0-9]+"}


def test_chat_completion_tools_formats_logprobs_and_usage(hf: InferenceClient) -> None:
    """huggingface_hub's chat_completion in TGI's Messages API: tool calls whole and streamed
    (tool_choice auto / required / by name, TGI's bare-name form too), response_format,
    logprobs, and the usage chunk of stream_options.include_usage (chat.rs: `choices: []`)."""
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}},
                   "get_weather"):
        out = hf.chat_completion(MSGS, tools=TOOLS, tool_choice=choice)  # type: ignore[arg-type]
        calls = out.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather"
        assert "city" in json.loads(calls[0].function.arguments)
    name, args = "", ""
    for chunk in hf.chat_completion(MSGS, tools=TOOLS, tool_choice="auto", stream=True):
        for t in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name += t.function.name or ""
            args += t.function.arguments or ""
    assert name == "get_weather" and "city" in json.loads(args)
    shaped = hf.chat_completion(MSGS, max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": JSON_A}})
    assert isinstance(json.loads(shaped.choices[0].message.content or "")["a"], int)
    lp = hf.chat_completion(MSGS, max_tokens=3, logprobs=True, top_logprobs=2)
    content = lp.choices[0].logprobs.content  # type: ignore[union-attr]
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 for t in content)
    chunks = list(hf.chat_completion(MSGS, max_tokens=3, stream=True,
                                     stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    assert all(c.usage is None for c in chunks[:-1])


def test_async_inference_client_and_errors_mid_stream(urls: tuple[str, str]) -> None:
    """AsyncInferenceClient as the sync one: a worker failure after the first token is TGI's
    `generation` error event on /generate_stream (GenerationError), and on the Messages API
    stream TGI's `{"error": {"message", "http_status_code": 422}}` event (infer/mod.rs
    into_openai_event), which huggingface_hub raises with no error_type (UnknownError)."""
    async def run() -> None:
        client = AsyncInferenceClient(base_url=urls[0], timeout=20)
        out = await client.text_generation(PROMPT, max_new_tokens=2, details=True)
        assert out.details is not None and out.details.generated_tokens == 2
        got = []
        with pytest.raises(hf_errors.GenerationError, match="Simulated engine error"):
            async for tok in await client.text_generation(PROMPT + " [[sim error_after=2]]",
                                                          stream=True):
                got.append(tok)
        assert len(got) == 2
        with pytest.raises(hf_errors.UnknownError, match="http_status_code"):
            async for _ in await client.chat_completion(
                    [{"role": "user", "content": "x [[sim error_after=1]]"}], stream=True):
                pass

    asyncio.run(run())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # its own pydantic `.dict()` calls
def test_text_generation_client_parameters(urls: tuple[str, str]) -> None:
    """text-generation 0.7.0's Client and AsyncClient with best_of, decoder_input_details,
    top_n_tokens and grammar (its types.Grammar), parsed by its pydantic Response models."""
    import text_generation as tg

    client = tg.Client(urls[0], timeout=20)
    best = client.generate(PROMPT, max_new_tokens=3, best_of=2, do_sample=True,
                           decoder_input_details=True, top_n_tokens=1)
    assert best.details.best_of_sequences and best.details.prefill[0].logprob is None
    assert best.details.top_tokens and len(best.details.top_tokens) == 3
    grammar = tg.types.Grammar(type=tg.types.GrammarType.Json, value=JSON_A)
    shaped = list(client.generate_stream(PROMPT, max_new_tokens=40, grammar=grammar))
    assert isinstance(json.loads(shaped[-1].generated_text or "")["a"], int)

    async def run() -> None:
        aclient = tg.AsyncClient(urls[0], timeout=20)
        out = await aclient.generate(PROMPT, max_new_tokens=2, top_n_tokens=2)
        assert out.details.top_tokens and [len(t) for t in out.details.top_tokens] == [2, 2]
        streamed = [r async for r in aclient.generate_stream(PROMPT, max_new_tokens=2)]
        assert streamed[-1].details is not None and streamed[-1].generated_text == \
            out.generated_text
        with pytest.raises(tg.errors.ValidationError, match="`top_n_tokens` must be"):
            await aclient.generate(PROMPT, top_n_tokens=9)

    asyncio.run(run())
