"""adapters.frontends.openai_parse reads a validated request's fields from the pydantic model's
`__dict__` (not through BaseModel's `__getattr__` slot hook): pydantic v2 keeps every declared
field there, set or defaulted, and a client's extra keys apart (`__pydantic_extra__`). A
pydantic that stored them otherwise would fail here, not in the parse."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from adapters.frontends import openai_parse
from schemas import canonical
from schemas import openai as wire

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi", "x": 1}], "top_k": 3,
        "max_tokens": 7, "stop": "s", "extra_field": {"a": 1}}


@pytest.mark.parametrize(("model", "body"), [
    (wire.ChatCompletionRequest, CHAT),
    (wire.CompletionRequest, {"prompt": "p", "n": 2, "suffix": "z", "other": None}),
    (wire.ChatMessage, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
])
def test_every_declared_field_is_in_the_instance_dict(model: type[BaseModel],
                                                      body: dict[str, Any]) -> None:
    raw = model.model_validate(body)
    assert raw.__dict__.keys() == model.model_fields.keys()
    assert all(raw.__dict__[name] is getattr(raw, name) for name in model.model_fields)
    extras = {k: v for k, v in body.items() if k not in model.model_fields}
    assert raw.model_extra == extras and not extras.keys() & raw.__dict__.keys()


def test_the_parse_reads_what_the_attributes_hold() -> None:
    req = openai_parse.chat_request(CHAT)
    s = req.sampling
    assert (s.max_tokens, s.top_k, s.stop, s.n) == (7, 3, ["s"], 1)
    assert req.extra == {"extra_field": {"a": 1}} and req.model == "m"
    assert [(m.role, m.content) for m in req.messages or []] == [("user", "hi")]


# each sampling field of the OpenAI schema, a valid value that no other field has by default,
# and the canonical field it lands in (`_common` builds `Sampling` positionally)
SAMPLING_FIELDS = [
    ("max_tokens", 11, "max_tokens", 11), ("min_tokens", 12, "min_tokens", 12),
    ("temperature", 0.13, "temperature", 0.13), ("top_p", 0.14, "top_p", 0.14),
    ("top_k", 15, "top_k", 15), ("min_p", 0.16, "min_p", 0.16),
    ("typical_p", 0.17, "typical_p", 0.17), ("repetition_penalty", 1.18, "repetition_penalty", 1.18),
    ("presence_penalty", 0.19, "presence_penalty", 0.19),
    ("frequency_penalty", 0.2, "frequency_penalty", 0.2),
    ("length_penalty", 0.21, "length_penalty", 0.21), ("seed", 22, "seed", 22),
    ("stop", ["x", "y"], "stop", ["x", "y"]), ("stop", "z", "stop", ["z"]),
    ("stop_token_ids", [23], "stop_token_ids", [23]), ("ignore_eos", True, "ignore_eos", True),
    ("n", 3, "n", 3), ("best_of", 24, "best_of", 24),
    ("logit_bias", {"5": 0.25}, "logit_bias", {"5": 0.25}),
    ("truncate_prompt_tokens", 26, "truncate", 26),
    ("skip_special_tokens", False, "skip_special_tokens", False),
]


@pytest.mark.parametrize(("key", "value", "name", "expected"), SAMPLING_FIELDS)
@pytest.mark.parametrize("chat", [True, False])
def test_each_sampling_field_lands_in_its_place(key: str, value: Any, name: str, expected: Any,
                                                 chat: bool) -> None:
    body = {**({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "p"}),
            key: value}
    s = (openai_parse.chat_request if chat else openai_parse.completion_request)(body).sampling
    unset = canonical.Sampling()
    assert getattr(s, name) == expected
    assert [f for f in canonical.Sampling.__slots__ if f != name
            and getattr(s, f) != getattr(unset, f)] == []
