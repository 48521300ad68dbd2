"""Failover of a chat stream on TGI and Triton workers: the real gateway app, the official
OpenAI SDK as the client, two fakes of the worker kind in-process (tests/fakes), the first
failing mid-stream with an in-band error. The client must get one stream (one id, one role,
the uncut text once, one finish, one usage counting the answer as one), and the second worker
must have been asked to continue the assistant's turn, not to start it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette

from adapters import base, registry
from gateway import config
from schemas import canonical
from tests.fakes import hosts, tgi_fake, triton_fake

TEMPLATE = (Path(__file__).parents[1] / "golden" / "triton" / "chat_template.jinja").read_text()
GENERATION_PROMPT = "<|start_header_id|>assistant<|end_header_id|>\n\n"


def make_config(backend: str, **model: Any) -> config.Config:
    return config.Config.model_validate({
        "server": {"failover_attempts": 1, "timeouts": {"first_byte": 5, "idle": 5}},
        "default_model": "m",
        "models": [{"name": "m", "backend": backend, "routing": "round_robin",  # a goes first
                    "upstreams": ["http://a:8000", "http://b:8000"], **model}]})


async def chat_stream(cfg: config.Config, fakes: dict[str, Starlette],
                      content: str, **kwargs: Any) -> list[Any]:
    async with hosts.serve(cfg, fakes) as gw:
        stream = await hosts.sdk(gw).chat.completions.create(
            model="m", messages=[{"role": "user", "content": content}], stream=True,
            stream_options={"include_usage": True}, **kwargs)
        return [c async for c in stream]


def one_stream(chunks: list[Any]) -> str:
    """The text, after checking the stream is one answer: one id, one role, one finish, one
    usage (the last chunk)."""
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].delta.role for c in chunks
            if c.choices and c.choices[0].delta.role] == ["assistant"]
    assert len([c for c in chunks if c.choices and c.choices[0].finish_reason]) == 1
    assert [c for c in chunks if c.usage is not None] == [chunks[-1]]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.anyio
async def test_triton_chat_is_continued_from_the_rendered_prompt_plus_the_text_so_far() -> None:
    """The gateway renders the chat (with the generation prompt, as on the first attempt) and
    appends the text the client has; `exclude_input_in_output: true` keeps that text out of
    the answer (an input of triton-inference-server/tensorrtllm_backend ensemble/config.pbtxt;
    without it the prompt may be in `text_output`, shared/research/wire-formats.md 6.2), so
    nothing is repeated."""
    a, b = triton_fake.app(), triton_fake.app()
    chunks = await chat_stream(make_config("triton", upstream_model="ensemble",
                                           chat_template=TEMPLATE),
                               {"a": a, "b": b}, "What is it? [[error_after=2]]",
                               max_tokens=20)
    assert one_stream(chunks) == "".join(triton_fake.SCRIPT)
    assert chunks[-2].choices[0].finish_reason == "stop"
    first, cont = a.state.requests[-1][1], b.state.requests[-1][1]
    assert first["text_input"].endswith(GENERATION_PROMPT)
    assert cont["text_input"] == first["text_input"] + " The answer"
    assert cont["exclude_input_in_output"] is True
    assert (first["max_tokens"], cont["max_tokens"]) == (20, 18)
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        len(first["text_input"].split()), len(triton_fake.SCRIPT))


@pytest.mark.anyio
async def test_tgi_chat_is_continued_as_the_final_assistant_message() -> None:
    """TGI >= 3.0 continues a final assistant message (huggingface/text-generation-inference
    router/src/infer/chat_template.rs `apply`: the rendered prompt is cut after that message's
    content; integration-tests/models/test_continue_final_message.py)."""
    a, b = tgi_fake.app(), tgi_fake.app()
    user = "What is it? [[error_after=3]]"
    chunks = await chat_stream(make_config("tgi"), {"a": a, "b": b}, user, max_tokens=20)
    script = "".join(t for t, _ in tgi_fake.SCRIPT)
    assert one_stream(chunks) == script
    assert chunks[-2].choices[0].finish_reason == "stop"
    cont = b.state.requests[-1][1]
    assert cont["messages"] == [{"role": "user", "content": user},
                                {"role": "assistant", "content": " The answer is"}]
    assert a.state.requests[-1][1]["max_tokens"] == 20 and cont["max_tokens"] == 17
    assert "continue_final_message" not in cont  # not a TGI field: it continues by itself
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        len(user.split()), len(tgi_fake.SCRIPT) + 1)  # and EOS


@pytest.mark.anyio
async def test_tgi_chat_continued_after_whitespace_does_not_repeat_it() -> None:
    """TGI trims the end of the continued message (chat_template.rs `apply`: `.trim_end()`),
    so the model writes the cut-off newline again; the client already has it."""
    a, b = tgi_fake.app(), tgi_fake.app()
    chunks = await chat_stream(make_config("tgi"), {"a": a, "b": b},
                               "What is it? [[error_after=6]]")
    assert one_stream(chunks) == "".join(t for t, _ in tgi_fake.SCRIPT)
    assert b.state.requests[-1][1]["messages"][-1] == {"role": "assistant",
                                                       "content": " The answer is 42.\n"}


def test_tgi_continues_a_clients_own_prefill_with_the_text_after_it() -> None:
    """A client's final assistant message is a prefill TGI was already continuing
    (chat_template.rs `apply`): the continuation is that message with the text so far after
    it, not a second assistant message."""
    req = canonical.InferenceRequest(messages=[
        canonical.Message("user", "Go on"), canonical.Message("assistant", " The")],
        stream=True, sampling=canonical.Sampling(max_tokens=5))
    backend = registry.backend("tgi")
    cont = backend.continuation(req, " answer", 1)
    assert cont is not None and req.messages is not None and len(req.messages) == 2
    body = orjson.loads(backend.build(cont, base.Target("http://t", "m", {})).body)
    assert body["messages"] == [{"role": "user", "content": "Go on"},
                                {"role": "assistant", "content": " The answer"}]
    assert body["max_tokens"] == 4


@pytest.mark.anyio
async def test_a_completion_without_a_limit_is_continued_within_the_protocols_default() -> None:
    """OpenAI's completions default to 16 tokens (OpenAI's API reference, `max_tokens`
    defaults to 16; vLLM protocol.py CompletionRequest.max_tokens = 16): the first attempt asks
    the Triton worker for 16 (`max_tokens` is a required input of tensorrtllm_backend
    ensemble/config.pbtxt), so its continuation after 2 tokens asks for the 14 left, not 16
    more (an answer of 18 tokens where the client's protocol gives 16 at most)."""
    a, b = triton_fake.app(), triton_fake.app()
    async with hosts.serve(make_config("triton", upstream_model="ensemble"),
                           {"a": a, "b": b}) as gw:
        stream = await hosts.sdk(gw).completions.create(
            model="m", prompt="Go [[error_after=2]]", stream=True)
        text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == "".join(triton_fake.SCRIPT)
    first, cont = a.state.requests[-1][1], b.state.requests[-1][1]
    assert cont["text_input"] == first["text_input"] + " The answer"
    assert (first["max_tokens"], cont["max_tokens"]) == (16, 14)
