"""adapters.frontends.openai_parse reads a validated request's fields from the pydantic model's
`__dict__` (not through BaseModel's `__getattr__` slot hook): pydantic v2 keeps every declared
field there, set or defaulted, and a client's extra keys apart (`__pydantic_extra__`). A
pydantic that stored them otherwise would fail here, not in the parse."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from adapters.frontends import openai_parse
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
