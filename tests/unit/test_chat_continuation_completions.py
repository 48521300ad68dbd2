"""A chat cut mid-stream on a worker whose chat route cannot continue an assistant turn
(trtllm-serve, plain OpenAI servers) is continued through its completions route: the chat
rendered with the model's `chat_template` (generation prompt added, as Triton's) plus the text
so far, the rest of the budget, the same sampling and stops.

Sources: NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py (ChatCompletionRequest has
no `continue_final_message` and `add_special_tokens` default false, "the chat template takes
care of adding the special tokens"; CompletionRequest `add_special_tokens` default true);
vLLM protocol.py CompletionRequest (`add_special_tokens` default true, `max_tokens` 16).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import orjson
import pytest
import respx

from adapters import base, chat_template, registry
from gateway import config, routing
from schemas import canonical
from tests.unit import test_pipeline_respx as harness

# Zephyr turns (TinyLlama-1.1B-Chat's template, `</s>` written out), opened by `bos_token`.
ZEPHYR = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}</s>\n"
          "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
# The same with the BOS written out, and ChatML (Qwen: no BOS at all).
WRITTEN_BOS = "<s>" + ZEPHYR.removeprefix("{{ bos_token }}")
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
USER = canonical.Message("user", "Hi")


def chat(**fields: object) -> canonical.InferenceRequest:
    sampling = canonical.Sampling(max_tokens=10, temperature=0.0, stop=["\n\n"])
    return dataclasses.replace(canonical.InferenceRequest(
        messages=[canonical.Message("system", "Be brief."), USER], stream=True,
        include_usage=True, sampling=sampling), **fields)


def continued(name: str, template: str, req: canonical.InferenceRequest | None = None
              ) -> base.UpstreamRequest | None:
    options = {"name": "m", "chat_template": template}
    b = registry.backend(name)
    cont = b.continuation(req or chat(), " The answer", 2, options)
    return None if cont is None else b.build(cont, base.Target("http://w:8000/", "org/m",
                                                                 options))


def test_render_opening_says_whether_the_template_opened_with_bos_token() -> None:
    assert chat_template.render_opening(ZEPHYR, [USER]) == (
        "<|user|>\nHi</s>\n<|assistant|>\n", True)
    assert chat_template.render_opening(WRITTEN_BOS, [USER]) == (
        "<s><|user|>\nHi</s>\n<|assistant|>\n", False)
    # a `bos_token` later in the prompt renders empty, as `render` has it
    assert chat_template.render_opening("x{{ bos_token }}y", [USER]) == ("xy", False)
    assert chat_template.render_opening(ZEPHYR, [USER])[0] == chat_template.render(ZEPHYR,
                                                                                   [USER])


def test_trtllm_continues_a_chat_on_its_completions_route() -> None:
    """The template opens with `bos_token` (rendered empty): CompletionRequest's default adds
    the BOS, so no `add_special_tokens` is sent; the chat's budget less the 2 tokens sent."""
    up = continued("trtllm", ZEPHYR)
    assert up is not None and up.url == "http://w:8000/v1/completions"
    assert up.body == (
        b'{"model":"org/m","prompt":"<|system|>\\nBe brief.</s>\\n<|user|>\\nHi</s>\\n'
        b'<|assistant|>\\n The answer","max_tokens":8,"temperature":0.0,"stop":["\\n\\n"],'
        b'"stream":true,"stream_options":{"include_usage":true}}')


@pytest.mark.parametrize("template", [WRITTEN_BOS, CHATML])
def test_trtllm_adds_no_special_tokens_where_the_template_did_not_ask_for_bos(
        template: str) -> None:
    """A BOS written out, or none (ChatML): encoded as the chat route would (no special tokens
    added), so the BOS is neither doubled nor added."""
    up = continued("trtllm", template)
    assert up is not None
    body = orjson.loads(up.body)
    assert body["add_special_tokens"] is False
    assert body["prompt"].endswith("assistant|>\n The answer" if template == WRITTEN_BOS
                                   else "assistant\n The answer")
    assert body["prompt"].startswith("<s><|system|>" if template == WRITTEN_BOS
                                     else "<|im_start|>system")


def test_openai_continues_a_chat_on_its_completions_route() -> None:
    up = continued("openai", ZEPHYR)
    assert up is not None and up.url == "http://w:8000/v1/completions"
    assert up.body == (
        b'{"model":"org/m","prompt":"<|system|>\\nBe brief.</s>\\n<|user|>\\nHi</s>\\n'
        b'<|assistant|>\\n The answer","max_tokens":8,"temperature":0.0,"stop":["\\n\\n"],'
        b'"stream":true,"stream_options":{"include_usage":true}}')
    chatml = continued("openai", CHATML)
    assert chatml is not None and b"add_special_tokens" not in chatml.body


def test_openai_does_not_continue_what_its_completions_route_would_say_otherwise() -> None:
    """No field to keep a plain OpenAI server from adding its BOS before one written out; no
    `max_tokens`: its completions default is 16 (OpenAI's API reference), a chat's the room."""
    assert continued("openai", WRITTEN_BOS) is None
    no_limit = chat(sampling=canonical.Sampling(temperature=0.0))
    assert not registry.backend("openai").continues(no_limit, {"chat_template": ZEPHYR})
    assert continued("openai", ZEPHYR, no_limit) is None
    up = continued("trtllm", ZEPHYR, no_limit)  # trtllm-serve: the engine's default, both routes
    assert up is not None and "max_tokens" not in orjson.loads(up.body)


@pytest.mark.parametrize("name", ["trtllm", "openai"])
@pytest.mark.parametrize("fields", [
    {"logprobs": True}, {"logprobs": True, "top_logprobs": 2}, {"per_token": True},
    {"reasoning_effort": "low"}, {"extra": {"chat_template_kwargs": {"enable_thinking": True}}},
    {"extra": {"add_special_tokens": True}}, {"tools": [canonical.ToolSpec("f")]},
])
def test_what_the_completions_route_cannot_say_is_not_continued(
        name: str, fields: dict[str, object]) -> None:
    """Logprobs would come in completions' form (no `bytes`, the sampled token among the
    alternatives); reasoning effort and chat-template kwargs change the rendering."""
    req = chat(**fields)
    assert not registry.backend(name).continues(req, {"chat_template": ZEPHYR})
    assert continued(name, ZEPHYR, req) is None


def test_without_a_chat_template_a_chat_is_not_continued() -> None:
    for name in ("trtllm", "openai"):
        assert not registry.backend(name).continues(chat())
        assert registry.backend(name).continuation(chat(), " x", 1) is None
        assert registry.backend(name).continuation(chat(), " x", 1, {"chat_template": None}) \
            is None


def test_trtllm_keeps_the_extras_completions_declare_alike() -> None:
    req = chat(extra={"priority": 0.5}, tool_choice="none", parallel_tool_calls=False)
    up = continued("trtllm", ZEPHYR, req)
    assert up is not None
    body = orjson.loads(up.body)
    assert body["priority"] == 0.5 and "tool_choice" not in body
    assert "parallel_tool_calls" not in body


def test_a_template_that_fails_on_the_chat_gives_no_continuation() -> None:
    raising = "{{ raise_exception('no system role') }}"
    assert registry.backend("trtllm").continues(chat(), {"chat_template": raising})
    assert continued("trtllm", raising) is None


HEAD = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"role":"assistant","content":""}}]} \n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"Hel"}}]}\n\n')
REST = (b'data: {"id":"cmpl-d","object":"text_completion","created":2,"model":"m","choices":'
        b'[{"index":0,"text":"lo","finish_reason":"stop"}]} \n\n'
        b'data: {"id":"cmpl-d","object":"text_completion","created":2,"model":"m","choices":[],'
        b'"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1}}\n\n'
        b"data: [DONE]\n\n")


@pytest.mark.anyio
async def test_a_trtllm_chat_cut_is_merged_from_the_completions_answer() -> None:
    """The continuation's `text_completion` chunks become the client's one
    chat.completion.chunk stream: one id, one role, the text once, one usage (the prompt as
    the chat's, the completion tokens of both workers)."""
    cfg = config.Config.model_validate({
        "server": {"failover_attempts": 1}, "default_model": "demo",
        "models": [{"name": "demo", "backend": "trtllm", "upstreams": [harness.UP1,
                                                                       harness.UP2],
                    "upstream_model": "org/model", "routing": "round_robin",
                    "chat_template": ZEPHYR}]})
    with respx.mock(assert_all_called=True) as r:
        harness.healthy(r)
        r.post(f"{harness.UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=harness.Broken([HEAD])))
        cont = r.post(f"{harness.UP2}/v1/completions").mock(return_value=httpx.Response(
            200, content=REST))
        resp = await harness.call(r, {**harness.CHAT, "stream": True, "max_tokens": 10,
                                      "stream_options": {"include_usage": True}}, cfg)
    sent = orjson.loads(cont.calls.last.request.content)
    assert sent["prompt"] == "<|user|>\nHi</s>\n<|assistant|>\nHel"
    assert sent["max_tokens"] == 9 and "add_special_tokens" not in sent
    chunks = [orjson.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello" and len({c["id"] for c in chunks}) == 1
    assert sum(1 for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"]] == ["stop"]
    assert [c["usage"] for c in chunks if c.get("usage")] == [
        {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10}]
    assert resp.text.endswith("data: [DONE]\n\n") and '"error"' not in resp.text


def managed(tmp_path: Path, args: tuple[str, ...] = ()) -> config.Config:
    return config.Config.model_validate({
        "models": [{"name": "m", "backend": "trtllm", "upstream_model": str(tmp_path)}],
        "workers": [{"kind": "trtllm", "model": "m", "args": list(args)}]})


def test_a_managed_trtllm_model_directory_gives_its_chat_template(tmp_path: Path) -> None:
    """trtllm-serve renders a chat with its tokenizer's template, which transformers reads
    from tokenizer_config.json `chat_template` (a string, or named templates) or
    chat_template.jinja: the template a continuation renders when the config names none."""
    (tmp_path / "tokenizer_config.json").write_bytes(orjson.dumps(
        {"chat_template": [{"name": "tool_use", "template": "x"},
                           {"name": "default", "template": ZEPHYR}]}))
    assert routing.Router(managed(tmp_path)).routes["m"].options["chat_template"] == ZEPHYR
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    assert routing.Router(managed(tmp_path)).routes["m"].options["chat_template"] == CHATML
    # a worker started with a template of its own: the directory's is not the one it renders
    router = routing.Router(managed(tmp_path, ("--chat_template", "t.jinja")))
    assert router.routes["m"].options["chat_template"] is None


def test_an_unmanaged_model_gets_no_directory_template(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    cfg = config.Config.model_validate({
        "models": [{"name": "m", "backend": "trtllm", "upstream_model": str(tmp_path),
                    "upstreams": ["http://w:1"]}]})
    assert routing.Router(cfg).routes["m"].options["chat_template"] is None
