"""Hypothesis: the Elastic front end under any input.

- Any event sequence gives a stream whose every event validates against the wire models
  (seed 004's envelope, or Elasticsearch's bare chunk), whose content and tool-call fragments
  join to what the worker said, ending with one usage chunk and [DONE]; the two framings
  differ only by the BOM before each event and the `chat_completion` envelope.
- Arbitrary JSON yields an InferenceRequest or a 4xx GatewayError, nothing else.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from adapters import base
from adapters.frontends import elastic
from adapters.frontends import elastic_encode as enc
from schemas import canonical, errors
from schemas import elastic as wire
from schemas import events as ev

META = base.ResponseMeta("p", 1, "demo")


def ctx() -> base.RequestContext:
    return base.RequestContext("/_inference/demo/_unified", {"id": "demo"},
                               {"content-type": "application/json"},
                               lambda name: {"name": "demo"})


texts = st.text(max_size=6)
event = st.one_of(
    st.builds(ev.TextDelta, st.just(0), texts),
    st.builds(ev.ReasoningDelta, st.just(0), texts),
    st.builds(ev.ToolCallDelta, st.just(0), st.integers(0, 2), st.none(), st.none(), texts),
)
finish = st.sampled_from(["eos", "stop_string", "length", "tool_calls", "content_filter"])


def stream(events: list[ev.Event], framing: enc.Framing) -> bytes:
    e = enc.ChatStreamEncoder(META, framing)
    return b"".join(e.encode(x) for x in events) + e.finish()


def data_lines(body: bytes, framing: enc.Framing) -> list[bytes]:
    out = []
    for block in body.split(b"\n\n")[:-1]:
        name, data = block.split(b"\n")
        assert name == (enc.BOM if framing == "server" else b"") + b"event: message"
        out.append(data.removeprefix(b"data: "))
    return out


@given(st.lists(event, max_size=10), finish,
       st.one_of(st.none(), st.builds(ev.Usage, st.integers(0, 99), st.integers(0, 99))))
def test_any_events_give_valid_equivalent_streams(events: list[ev.Event], reason: str,
                                                  usage: ev.Usage | None) -> None:
    # A call's first fragment carries its id and name (ToolCallDelta's contract).
    seen: set[int] = set()
    for x in events:
        if isinstance(x, ev.ToolCallDelta) and x.index not in seen:
            seen.add(x.index)
            x.id, x.name = f"call_{x.index}", "f"
    tail: list[ev.Event] = [ev.Finish(0, reason)]  # type: ignore[arg-type]
    if usage is not None:
        tail.append(usage)
    documented = data_lines(stream(events + tail, "documented"), "documented")
    server = data_lines(stream(events + tail, "server"), "server")
    assert documented[-1] == server[-1] == b"[DONE]"
    chunks = [wire.ChatCompletionChunk.model_validate_json(d) for d in server[:-1]]
    assert [wire.ChunkEnvelope.model_validate_json(d).chat_completion for d in documented[:-1]] \
        == chunks
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "".join(
        x.text for x in events if isinstance(x, ev.TextDelta))
    for i in seen:
        args = "".join(t.function.arguments or "" for d in deltas for t in d.tool_calls or ()
                       if t.index == i and t.function)
        assert args == "".join(x.arguments for x in events
                               if isinstance(x, ev.ToolCallDelta) and x.index == i)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert [c.usage is not None for c in chunks].count(True) == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=3),
    max_leaves=10)
field_names = st.sampled_from(["messages", "model", "max_completion_tokens", "stop",
                               "temperature", "tool_choice", "tools", "top_p", "input",
                               "task_settings", "role", "content", "x"])
bodies = st.dictionaries(field_names, json_values, max_size=5)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "x"])},
    optional={"content": json_values, "tool_call_id": json_values, "tool_calls": json_values}),
    max_size=3)


def parse_any(fe: base.Frontend, body: Any) -> None:
    try:
        req = fe.parse(json.dumps(body).encode(), ctx()).request
    except errors.GatewayError as exc:
        assert 400 <= exc.status < 500 and exc.message
        return
    assert isinstance(req, canonical.InferenceRequest) and req.model == "demo"


@given(bodies)
def test_arbitrary_json_is_a_request_or_a_4xx(body: dict[str, Any]) -> None:
    parse_any(elastic.ElasticChatFrontend(), body)
    parse_any(elastic.ElasticCompletionFrontend(), body)


@given(messages, bodies)
def test_arbitrary_messages_are_a_request_or_a_4xx(msgs: list[dict[str, Any]],
                                                    extra: dict[str, Any]) -> None:
    parse_any(elastic.ElasticChatFrontend(), {**extra, "messages": msgs})
