"""What the OpenAI front end accepts and refuses, against the servers clients expect.

Each case pins a rule of vLLM's request models (vllm-project/vllm
`vllm/entrypoints/openai/protocol.py`, `ChatCompletionRequest` and its `check_tool_usage`
validator; `vllm/sampling_params.py` `SamplingParams.from_optional`), which agree with OpenAI's
API reference (https://platform.openai.com/docs/api-reference/chat/create: `n` is
"integer or null", `tool_choice` needs `tools`)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.frontends import lmi_params, openai_parse, tgi_chat
from schemas import errors

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **fields}


def test_chat_n_null_is_one() -> None:
    """vLLM protocol.py: `n: Optional[int] = 1`, and `SamplingParams.from_optional` reads
    None as 1; a client SDK that sends every optional field (`"n": null`) is answered."""
    assert openai_parse.chat_request(_chat(n=None)).sampling.n == 1


def test_completion_n_null_is_one() -> None:
    """OpenAI's completions reference: `n` is "integer or null" (default 1)."""
    req = openai_parse.completion_request({"model": "m", "prompt": "p", "n": None})
    assert req.sampling.n == 1


@pytest.mark.parametrize("choice", ["auto", "required",
                                    {"type": "function", "function": {"name": "f"}}])
def test_tool_choice_without_tools_is_refused(choice: Any) -> None:
    """vLLM protocol.py check_tool_usage: "When using `tool_choice`, `tools` must be set."
    (a 400 before any worker is asked, not a worker's refusal or a silent plain answer)."""
    with pytest.raises(errors.InvalidRequest) as info:
        openai_parse.chat_request(_chat(tool_choice=choice))
    assert info.value.status == 400 and info.value.field == "tool_choice"
    assert "`tools`" in info.value.message


def test_tool_choice_none_without_tools_is_taken() -> None:
    """vLLM protocol.py check_tool_usage: `tool_choice: "none"` needs no validation."""
    assert openai_parse.chat_request(_chat(tool_choice="none")).tool_choice == "none"


def test_named_tool_choice_must_name_a_tool() -> None:
    """vLLM protocol.py check_tool_usage: "The tool specified in `tool_choice` does not match
    any of the specified `tools`"."""
    choice = {"type": "function", "function": {"name": "g"}}
    with pytest.raises(errors.InvalidRequest) as info:
        openai_parse.chat_request(_chat(tools=TOOLS, tool_choice=choice))
    assert info.value.field == "tool_choice" and "`tools`" in info.value.message
    named = {"type": "function", "function": {"name": "f"}}
    assert openai_parse.chat_request(_chat(tools=TOOLS, tool_choice=named)).tool_choice == "f"


def test_required_with_an_empty_tool_list_is_none() -> None:
    """vLLM protocol.py check_tool_usage: `tool_choice: "required"` with `tools: []` behaves
    like "none" ("to align with OpenAI's behavior"): answered as plain chat, not refused by the
    worker for a `tool_choice` sent without `tools`."""
    req = openai_parse.chat_request(_chat(tools=[], tool_choice="required"))
    assert req.tools is None and req.tool_choice in (None, "none")


def test_auto_with_an_empty_tool_list_sends_no_choice() -> None:
    """vLLM protocol.py check_tool_usage takes `tools: []` with "auto" (no tool to call):
    nothing is forwarded that a worker would refuse for want of `tools`."""
    req = openai_parse.chat_request(_chat(tools=[], tool_choice="auto"))
    assert req.tools is None and req.tool_choice is None


@pytest.mark.parametrize("choice", ["auto", "required", "g"])
def test_tgi_clients_tool_choice_without_tools_is_ignored(choice: str) -> None:
    """TGI reads a tool choice only with tools (huggingface/text-generation-inference
    router/src/lib.rs `try_into_generate`: `if let Some(tools) = tools { ToolGrammar::apply
    ... }`, else plain chat): a TGI client's request is answered plainly, not refused as vLLM
    refuses it."""
    req = tgi_chat.chat_request({"model": "tgi", "messages": MESSAGES, "tool_choice": choice})
    assert req.tools is None and req.tool_choice is None


@pytest.mark.parametrize("stop", ["", ["done", ""]])
def test_an_empty_stop_string_is_refused(stop: Any) -> None:
    """vLLM sampling_params.py `_verify_args`: "stop cannot contain an empty string." (a 400);
    forwarded, a worker that matches stop strings itself would stop at once."""
    for parse, body in ((openai_parse.chat_request, _chat(stop=stop)),
                        (openai_parse.completion_request, {"prompt": "p", "stop": stop})):
        with pytest.raises(errors.InvalidRequest) as info:
            parse(body)
        assert info.value.field == "stop" and "empty string" in info.value.message


def test_lmi_empty_stop_sequence_is_refused() -> None:
    """DJL's vLLM handler passes `stop_sequences` to vLLM's SamplingParams as `stop`
    (vllm_rolling_batch.py translate_vllm_params), which refuses an empty string."""
    with pytest.raises(errors.InvalidRequest) as info:
        lmi_params.inputs_request({"inputs": "Hi", "parameters": {"stop_sequences": ["a", ""]}},
                                  False, False)
    assert info.value.field == "parameters.stop_sequences"
