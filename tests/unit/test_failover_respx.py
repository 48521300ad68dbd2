"""Failover at the upstream seam: the continuation request each worker protocol gets, and the
one stream the client sees (vLLM: `continue_final_message`; completions: prompt + text)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import base, registry
from gateway import config, upstream_clients
from schemas import canonical
from tests.unit import test_pipeline_respx as harness

UP1, UP2 = harness.UP1, harness.UP2
HEAD = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n')
REST = (b'data: {"id":"d","object":"chat.completion.chunk","created":2,"model":"m","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
        b'data: {"id":"d","object":"chat.completion.chunk","created":2,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n'
        b'data: {"id":"d","object":"chat.completion.chunk","created":2,"model":"m","choices":[],'
        b'"usage":{"prompt_tokens":4,"total_tokens":5,"completion_tokens":1}}\n\n'
        b"data: [DONE]\n\n")
# The start of an n=2 stream: each choice's first text, then the worker breaks (Broken).
TWO_CHOICES_HEAD = b"".join(
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":%d,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}'
    b"\n\n" % i for i in (0, 1))


@pytest.mark.anyio
async def test_chat_cut_after_first_byte_is_continued_on_the_other_worker() -> None:
    with respx.mock(assert_all_called=True) as r:
        harness.healthy(r)  # the other worker passes its probe
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=harness.Broken([HEAD])))
        cont = r.post(f"{UP2}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=REST))
        resp = await harness.call(r, {**harness.CHAT, "stream": True, "max_tokens": 10,
                                      "stream_options": {"include_usage": True}})
    sent = orjson.loads(cont.calls.last.request.content)
    assert sent["messages"][-1] == {"role": "assistant", "content": "Hel"}
    assert (sent["continue_final_message"], sent["add_generation_prompt"]) == (True, False)
    assert sent["max_tokens"] == 9
    chunks = [orjson.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello" and len({c["id"] for c in chunks}) == 1
    assert sum(1 for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]) == 1
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "total_tokens": 5,
                                   "completion_tokens": 2}
    assert resp.text.endswith("data: [DONE]\n\n") and '"error"' not in resp.text


@pytest.mark.anyio
async def test_a_cut_after_every_choice_finished_asks_no_worker_for_more() -> None:
    """The worker sent every choice's finish, then the connection broke before its usage and
    `[DONE]`: the answer is whole, so no worker is asked to go on past its end (which would
    append text after the finish); the stream ends as the client expects."""
    done = HEAD + (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
                   b'"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}'
                   b"\n\n")
    with respx.mock(assert_all_called=False) as r:
        harness.healthy(r)  # the other worker passes its probe
        r.post(f"{UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=harness.Broken([done])))
        other = r.post(f"{UP2}/v1/chat/completions").mock(return_value=httpx.Response(
            200, content=REST))
        resp = await harness.call(r, {**harness.CHAT, "stream": True})
    assert other.call_count == 0
    chunks = [orjson.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello" and '"error"' not in resp.text
    assert resp.text.endswith("data: [DONE]\n\n")


@pytest.mark.anyio
async def test_a_lone_worker_is_not_asked_to_continue_its_own_answer() -> None:
    """SPEC.md: a stream is continued on *another* worker. With one upstream the cut stream
    ends with the in-band error, as without failover: the failed worker may be dead, and one
    that cannot continue its own answer would start it again (duplicated text)."""
    cfg = config.Config.model_validate({
        "default_model": "demo",
        "models": [{"name": "demo", "backend": "vllm", "upstreams": [UP1]}]})
    with respx.mock(assert_all_called=True) as r:
        harness.healthy(r)  # the other worker passes its probe
        only = r.post(f"{UP1}/v1/chat/completions").mock(side_effect=lambda _: httpx.Response(
            200, stream=harness.Broken([HEAD])))
        resp = await harness.call(r, {**harness.CHAT, "stream": True}, cfg)
    assert only.call_count == 1
    chunks = [orjson.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in chunks if c.get("choices"))
    assert text == "Hel" and '"error"' in resp.text


def test_each_backend_decides_what_it_can_continue() -> None:
    chat = canonical.InferenceRequest(messages=[canonical.Message("user", "hi")], stream=True)
    text = canonical.InferenceRequest(prompts=["Once"], stream=True,
                                      sampling=canonical.Sampling(max_tokens=5))
    for name in ("vllm", "openai", "trtllm", "tgi", "triton"):
        b = registry.backend(name)
        cont = b.continuation(text, " upon", 1)
        assert cont is not None and cont.prompts == ["Once upon"]
        assert cont.sampling.max_tokens == 4
        # vLLM (continue_final_message), TGI (a final assistant message is continued),
        # Triton (the gateway renders the prompt); OpenAI and trtllm-serve only through
        # their completions route with the model's chat template, which this one lacks.
        assert (b.continuation(chat, " x", 1) is not None) == (name in ("vllm", "tgi", "triton"))
    two = canonical.InferenceRequest(prompts=["a"], sampling=canonical.Sampling(n=2))
    tools = canonical.InferenceRequest(messages=[canonical.Message("user", "hi")],
                                       tools=[canonical.ToolSpec("f")])
    assert registry.backend("vllm").continuation(two, "x", 1) is None
    assert registry.backend("vllm").continuation(tools, "x", 1) is None


@pytest.mark.anyio
async def test_streams_breaking_after_the_first_byte_count_toward_ejection() -> None:
    cfg = harness.make_config(failover_attempts=0)
    with respx.mock(assert_all_called=True) as r:
        harness.healthy(r)  # the other worker passes its probe
        harness.healthy(r)
        bad = r.post(f"{UP1}/v1/chat/completions").mock(side_effect=lambda _: httpx.Response(
            200, stream=harness.Broken([HEAD])))
        r.post(f"{UP2}/v1/chat/completions").mock(side_effect=lambda _: httpx.Response(
            200, content=REST))
        from gateway import app as gateway_app
        from gateway import upstream

        def factory(_: object) -> upstream.UpstreamClient:
            return upstream_clients.HttpxClient(httpx.AsyncClient(transport=httpx.MockTransport(
                r.async_handler)))

        app = gateway_app.build_app(cfg, factory)
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://gw") as client:
                for _ in range(10):
                    await client.post("/v1/chat/completions",
                                      json={**harness.CHAT, "stream": True})
    assert bad.call_count == 3  # round robin gave it every other stream until the third broke


@settings(max_examples=200, deadline=None)
@given(chat=st.booleans(), prompts=st.integers(0, 2), ids=st.booleans(), n=st.integers(1, 2),
       tools=st.booleans(), echo=st.booleans(), best_of=st.sampled_from([None, 2]),
       name=st.sampled_from(["vllm", "openai", "trtllm", "tgi", "triton"]),
       template=st.booleans(), max_tokens=st.sampled_from([None, 8]))
def test_continues_says_what_continuation_does_without_making_a_request(
        chat: bool, prompts: int, ids: bool, n: int, tools: bool, echo: bool,
        best_of: int | None, name: str, template: bool, max_tokens: int | None) -> None:
    """Every stream asks `continues` (whether its progress is worth tracking); only a failover
    asks `continuation`. They must agree for every request shape, with the model's chat
    template or without (one that renders every chat)."""
    prompt: str | list[int] = [1, 2] if ids else "Once"
    req = canonical.InferenceRequest(
        messages=[canonical.Message("user", "hi")] if chat else None,
        prompts=None if chat else [prompt] * prompts, stream=True,
        sampling=canonical.Sampling(n=n, best_of=best_of, max_tokens=max_tokens),
        tools=[canonical.ToolSpec("f")] if tools else None, echo=echo)
    options = {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"} \
        if template else {}
    b = registry.backend(name)
    assert b.continues(req, options) == (b.continuation(req, " upon", 1, options) is not None)


@pytest.mark.anyio
async def test_a_completion_without_a_limit_is_continued_within_its_default_of_16() -> None:
    """vLLM's completions default `max_tokens` is 16 (protocol.py CompletionRequest; OpenAI's
    API reference likewise): a stream cut after one token is continued with `max_tokens` 15,
    not with the worker's default again (which would let the answer run to 17 tokens)."""
    head = (b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":'
            b'[{"index":0,"text":"Hel","logprobs":null,"finish_reason":null}]}\n\n')
    rest = (b'data: {"id":"d","object":"text_completion","created":2,"model":"m","choices":'
            b'[{"index":0,"text":"lo","logprobs":null,"finish_reason":"length"}]}\n\n'
            b"data: [DONE]\n\n")
    with respx.mock(assert_all_called=True) as r:
        harness.healthy(r)
        first = r.post(f"{UP1}/v1/completions").mock(return_value=httpx.Response(
            200, stream=harness.Broken([head])))
        cont = r.post(f"{UP2}/v1/completions").mock(return_value=httpx.Response(
            200, content=rest))
        resp = await harness.call(r, {"model": "demo", "prompt": "Say", "stream": True},
                                  path="/v1/completions")
    assert "max_tokens" not in orjson.loads(first.calls.last.request.content)
    sent = orjson.loads(cont.calls.last.request.content)
    assert (sent["prompt"], sent["max_tokens"]) == ("SayHel", 15)
    assert resp.text.endswith("data: [DONE]\n\n") and '"error"' not in resp.text


def test_vllm_continues_a_clients_own_prefill_with_the_text_after_it() -> None:
    """A client that asked vLLM to continue its own final assistant message
    (`continue_final_message: true`, vLLM protocol.py ChatCompletionRequest: "the final message
    in the prompt will be open-ended") has that message's content then the text so far as the
    turn being written: the continuation extends that message, as TGI's does, not a second
    assistant message after it (which vLLM would render after the prefill's closed turn)."""
    req = canonical.InferenceRequest(
        messages=[canonical.Message("user", "Go on"), canonical.Message("assistant", " The")],
        stream=True, sampling=canonical.Sampling(max_tokens=5),
        extra={"continue_final_message": True, "add_generation_prompt": False})
    backend = registry.backend("vllm")
    cont = backend.continuation(req, " answer", 1)
    assert cont is not None and req.messages is not None and len(req.messages) == 2
    body = orjson.loads(backend.build(cont, base.Target("http://v", "m", {})).body)
    assert body["messages"] == [{"role": "user", "content": "Go on"},
                                {"role": "assistant", "content": " The answer"}]
    assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
    assert body["max_tokens"] == 4


@pytest.mark.parametrize("extra", [
    {"structured_outputs": {"regex": "[0-9]+"}}, {"guided_json": {"type": "object"}},
    {"guided_regex": "a+"}, {"guided_choice": ["yes", "no"]}, {"guided_grammar": "root ::= x"},
    {"structural_tag": "{}"}])
def test_a_structured_answer_is_not_continued(extra: dict[str, Any]) -> None:
    """A guide (vLLM protocol.py `structured_outputs` and its older `guided_*` fields; TGI's
    front end sends a regex grammar as `structured_outputs`) constrains the whole answer: a
    continuation would hold only its rest to it, as `response_format` already is not
    continued."""
    text = canonical.InferenceRequest(prompts=["Once"], stream=True, extra=extra,
                                      sampling=canonical.Sampling(max_tokens=5))
    chat = canonical.InferenceRequest(messages=[canonical.Message("user", "hi")], stream=True,
                                      extra=extra)
    for name in ("vllm", "tgi", "triton"):
        b = registry.backend(name)
        assert b.continuation(text, " upon", 1) is None and not b.continues(text)
        assert b.continuation(chat, " x", 1) is None and not b.continues(chat)
