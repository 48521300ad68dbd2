"""trtllm-serve's two request classes declare different fields, and both forbid the others.

Source: NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py (OpenAIBaseModel
`extra="forbid"`; ChatCompletionRequest declares `echo`, `add_generation_prompt`, `documents`,
`chat_template`, `chat_template_kwargs`, `cache_salt`, `media_io_kwargs`, `mm_processor_kwargs`,
`thinking`, `agent_hierarchy`, `reasoning_effort`; CompletionRequest declares
`return_context_logits` and `detokenize`; each refuses the other's with a 400). The fake's
per-route field sets (tests/fakes/trtllm_fake.py) are written from that source, not from the
gateway's tables, so they are the yardstick here.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from adapters import base, registry
from adapters.backends import trtllm
from schemas import errors
from tests.fakes import trtllm_fake
from tests.unit.test_openai_backend_params import chat, completion

TARGET = base.Target("http://worker:8000/", "org/m")
# A value each extra takes (structured_outputs must name a guide to become response_format).
VALUES: dict[str, Any] = {"structured_outputs": {"regex": "[0-9]+"}, "thinking": {},
                          "documents": [], "chat_template_kwargs": {}}




ROUTES = {"chat": (chat, trtllm_fake.ALLOWED_CHAT),
          "completions": (completion, trtllm_fake.ALLOWED_COMPLETIONS)}
# Every extra on every route; `echo` is an extra on chat only (a canonical completions field).
CASES = [(route, name) for route in sorted(ROUTES)
         for name in sorted(trtllm.TrtllmBackend.ACCEPTED_EXTRAS | {"echo"})
         if (route, name) != ("completions", "echo")]


@pytest.mark.parametrize(("route", "name"), CASES)
def test_an_extra_goes_only_to_the_route_that_declares_it(route: str, name: str) -> None:
    """A declared extra reaches the route's body, and nothing the route does not declare
    does; an extra the route does not declare is our 400 naming it, before any I/O (not the
    worker's "Extra inputs are not permitted")."""
    make, allowed = ROUTES[route]
    req = make(**{name: VALUES.get(name, True)})
    backend = registry.backend("trtllm")
    declared = name in allowed or (name == "structured_outputs")  # sent as response_format
    if not declared:
        with pytest.raises(errors.Unsupported) as info:
            backend.check(req)
        assert info.value.message == \
            f"`{name}` is not supported by this model's worker (trtllm-serve)"
        assert info.value.field == name
        return
    backend.check(req)
    body = orjson.loads(backend.build(req, TARGET).body)
    assert set(body) <= allowed, set(body) - allowed
    assert name in body or name == "structured_outputs"


def test_the_chat_only_fields_a_review_named_are_refused_on_completions() -> None:
    for name in ("chat_template_kwargs", "documents", "add_generation_prompt"):
        with pytest.raises(errors.Unsupported):
            registry.backend("trtllm").check(completion(**{name: VALUES.get(name, True)}))
    for name in ("detokenize", "return_context_logits"):
        with pytest.raises(errors.Unsupported):
            registry.backend("trtllm").check(chat(**{name: True}))


def test_a_chat_continued_on_completions_keeps_only_what_completions_declare() -> None:
    """TrtllmBackend.COMPLETION_EXTRAS: each one CompletionRequest declares."""
    assert trtllm.TrtllmBackend.COMPLETION_EXTRAS <= trtllm_fake.ALLOWED_COMPLETIONS
    assert trtllm.TrtllmBackend.COMPLETION_EXTRAS <= trtllm_fake.ALLOWED_CHAT


@pytest.mark.parametrize("effort", ["minimal", "xhigh", "extreme"])
def test_a_reasoning_effort_trtllm_serve_does_not_type_is_our_400(effort: str) -> None:
    """openai_protocol.py ChatCompletionRequest: `reasoning_effort` is openai_harmony's
    ReasoningEffort (low, medium, high) or "max" / "none"; OpenAI's "minimal" and "xhigh"
    are trtllm-serve's 400, so the gateway refuses them first, naming the field."""
    with pytest.raises(errors.Unsupported) as info:
        registry.backend("trtllm").check(chat(reasoning_effort=effort))
    assert info.value.field == "reasoning_effort"
    assert info.value.message.startswith(
        f"`reasoning_effort` is not supported by this model's worker (trtllm-serve): "
        f"'{effort}' is not one of 'low', 'medium', 'high', 'max', 'none'")


@pytest.mark.parametrize("effort", ["low", "medium", "high", "max", "none"])
def test_a_reasoning_effort_trtllm_serve_types_is_sent(effort: str) -> None:
    req = chat(reasoning_effort=effort)
    backend = registry.backend("trtllm")
    backend.check(req)
    assert orjson.loads(backend.build(req, TARGET).body)["reasoning_effort"] == effort


def test_vllm_takes_every_openai_reasoning_effort() -> None:
    """vLLM chat_completion/protocol.py: `reasoning_effort: Literal["none", "minimal", "low",
    "medium", "high", "xhigh", "max"]`: OpenAI's whole set goes as written."""
    for effort in ("none", "minimal", "low", "medium", "high", "xhigh"):
        req = chat(reasoning_effort=effort)
        backend = registry.backend("vllm")
        backend.check(req)
        assert orjson.loads(backend.build(req, TARGET).body)["reasoning_effort"] == effort
