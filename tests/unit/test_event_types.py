"""Every canonical event a decoder hands on is of its declared types, whatever JSON the worker
put where: a value of another type is the worker's malformed answer (UpstreamBroken), said in
the client's own error form. The encoders trust the events: the compiled build's check the
declared type of each field they read, so a role, a call's name or a log prob's token of
another type would end the stream there as the gateway's own bug (the in-band internal error
with the bug's log line), where the pure build would relay it into a client's answer that its
SDK cannot read (openai-python's models declare the same types)."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import base
from adapters.backends import checked, openai_decode, tgi_decode, triton_decode
from adapters.frontends import openai_encode
from schemas import canonical, errors
from schemas import events as ev

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False,
                                                               allow_infinity=False)
    | st.sampled_from(["", "a", "0", "12", "token_id:7", "token_id:99999999999999999999",
                       "stop", "length", 2**63, 2**64 - 1, -2**63, 1e19, 1e300]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["a", "0", "1", "token", "logprob", "id", "text"]), inner, max_size=3),
    max_leaves=6)

LOGPROB = {"token": "hi", "logprob": -0.5, "bytes": [104, 105],
           "top_logprobs": [{"token": "hi", "logprob": -0.5, "bytes": [104, 105]}]}
USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
         "completion_tokens_details": {"reasoning_tokens": 0},
         "prompt_tokens_details": {"cached_tokens": 0}}
CALL = {"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "f", "arguments": "{}"}}
CHAT_CHUNK = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
              "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi",
                                                 "reasoning": "r", "tool_calls": [CALL]},
                           "logprobs": {"content": [LOGPROB]}, "token_ids": [5],
                           "finish_reason": "stop", "stop_reason": None}],
              "usage": USAGE}
TEXT_CHUNK = {"choices": [{"index": 0, "text": "hi", "token_ids": [5],
                           "logprobs": {"tokens": ["hi"], "token_logprobs": [-0.5],
                                        "top_logprobs": [{"hi": -0.5}], "text_offset": [0]},
                           "prompt_token_ids": [1, 2],
                           "prompt_logprobs": [None, {"2": {"logprob": -1.0, "rank": 1,
                                                            "decoded_token": "b"}}],
                           "finish_reason": "length", "stop_reason": None}],
              "usage": USAGE}
CHAT_BODY = {"choices": [{"index": 0, "message": {
    "role": "assistant", "content": "hi", "reasoning_content": "r",
    "tool_calls": [{k: v for k, v in CALL.items() if k != "index"}]},
    "logprobs": {"content": [LOGPROB]}, "finish_reason": "tool_calls"}],
    "usage": USAGE, "prompt_logprobs": [None], "prompt_token_ids": [1]}
TGI_TOKEN = {"id": 5, "text": "hi", "logprob": -0.5, "special": False}
TGI_LAST = {"index": 1, "token": TGI_TOKEN, "top_tokens": [TGI_TOKEN], "generated_text": "hi",
            "details": {"finish_reason": "length", "generated_tokens": 1, "seed": None,
                        "input_length": 3}}
TGI_BODY = {"generated_text": "hi", "details": {
    "finish_reason": "eos_token", "generated_tokens": 1, "seed": None,
    "prefill": [{"id": 1, "text": "a", "logprob": None}], "tokens": [TGI_TOKEN],
    "top_tokens": [[TGI_TOKEN]],
    "best_of_sequences": [{"generated_text": "ho", "finish_reason": "length",
                           "generated_tokens": 1, "tokens": [TGI_TOKEN]}]}}
TRITON_LAST = {"model_name": "ensemble", "text_output": "hi", "num_input_tokens": 3,
               "num_output_tokens": 1, "output_log_probs": [-0.5], "cum_log_probs": -0.5}

Make = Callable[[], base.StreamDecoder]
# a decoder, its framing ("sse": the template as one event, then the terminator), a template
STREAMS: dict[str, tuple[Make, str, dict[str, Any]]] = {
    "openai-chat-stream": (lambda: openai_decode.OpenAIDecoder(True, True), "sse", CHAT_CHUNK),
    "openai-text-stream": (lambda: openai_decode.OpenAIDecoder(False, True, True), "sse",
                           TEXT_CHUNK),
    "openai-chat-whole": (lambda: openai_decode.OpenAIDecoder(True, False, True), "whole",
                          CHAT_BODY),
    "openai-text-whole": (lambda: openai_decode.OpenAIDecoder(False, False, True), "whole",
                          TEXT_CHUNK),
    "tgi-chat-stream": (lambda: tgi_decode.TgiChatDecoder(True, ["o"], False), "sse",
                        CHAT_CHUNK),
    "tgi-stream": (lambda: tgi_decode.TgiStreamDecoder(["o"], False, True), "sse-last",
                   TGI_LAST),
    "tgi-whole": (lambda: tgi_decode.TgiWholeDecoder(["o"], False, True, None, 2), "whole",
                  TGI_BODY),
    "triton-stream": (lambda: triton_decode.TritonDecoder(True, 16, ["o"], False), "sse-last",
                      TRITON_LAST),
    "triton-whole": (lambda: triton_decode.TritonDecoder(False, 16, ["o"], False), "whole",
                     TRITON_LAST),
}


def paths(obj: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a template a value sits, the containers too."""
    out = [at] if at else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, (*at, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, (*at, i))
    return out


def replaced(template: dict[str, Any], at: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(template)
    holder = out
    for k in at[:-1]:
        holder = holder[k]
    holder[at[-1]] = value
    return out


def decoded(make: Make, framing: str, obj: dict[str, Any]) -> list[ev.Event]:
    dec = make()
    body = orjson.dumps(obj)
    if framing == "whole":
        return dec.feed(body) + dec.close()
    tail = b"data: [DONE]\n\n" if framing == "sse" else b""
    return dec.feed(b"data: " + body + b"\n\n" + tail) + dec.close()


def of_type(value: Any, hint: Any) -> bool:
    """`value` is of the annotation `hint`, as a compiled reader checks it (an int is a float;
    a bool is an int, as in Python), and an int one the encoders can write."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float)
    if origin in (typing.Union, types.UnionType):
        return any(of_type(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(of_type(v, item) for v in value)
    if dataclasses.is_dataclass(hint):  # the source's class: the same name
        return type(value).__name__ == hint.__name__ and well_typed(value)
    if hint is int:  # and one orjson can write
        return isinstance(value, int) and checked.INT_MIN <= value <= checked.INT_MAX
    return isinstance(value, hint)


def declared() -> dict[str, dict[str, Any]]:
    """Each event class's field types as its source declares them. Compiled (setup.py), a
    class's annotations hold only what its native layout checks (`type` for `list[int] |
    None`), so they are read from the source, run here as a plain module."""
    source = importlib.util.spec_from_file_location("events_as_declared",
                                                    Path(ev.__file__).parent / "events.py")
    assert source is not None and source.loader is not None
    module = importlib.util.module_from_spec(source)
    sys.modules[source.name] = module  # dataclasses resolves the module's own names
    try:
        source.loader.exec_module(module)
    finally:
        del sys.modules[source.name]
    return {name: typing.get_type_hints(getattr(module, name), vars(module))
            for name in (*(cls.__name__ for cls in typing.get_args(ev.Event)),
                         "TokenLogprob", "TopLogprob")}


HINTS = declared()


def well_typed(e: Any) -> bool:
    return all(of_type(getattr(e, f.name), HINTS[type(e).__name__][f.name])
               for f in dataclasses.fields(e))


def test_the_templates_decode_into_well_typed_events() -> None:
    """The unchanged templates are good answers: what the property below varies is read."""
    for name, (make, framing, template) in STREAMS.items():
        events = decoded(make, framing, template)
        assert len(events) >= 3, name
        assert all(well_typed(e) for e in events), (name, events)


@settings(max_examples=600, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(STREAMS)), value=JSON)
def test_a_value_of_any_json_type_anywhere_gives_well_typed_events_or_a_malformed_answer(
        data: st.DataObject, name: str, value: Any) -> None:
    make, framing, template = STREAMS[name]
    at = data.draw(st.sampled_from(paths(template)), label="path")
    try:
        events = decoded(make, framing, replaced(template, at, value))
    except errors.GatewayError:
        return  # the worker's answer refused, in the client's own form
    bad = [e for e in events if not well_typed(e)]
    assert not bad, (at, value, bad)
    for enc in openai_encoders(name.endswith("-whole")):
        b"".join([enc.encode(e) for e in events]) + enc.finish()  # raises nothing


META = base.ResponseMeta("abc", 1700000000, "demo")


def openai_encoders(whole: bool) -> list[openai_encode.ChatStreamEncoder
                                         | openai_encode.CompletionStreamEncoder]:
    """The compiled build's encoders, reading every field a client may ask for."""
    req = canonical.InferenceRequest(
        messages=[canonical.Message("user", "hi")], stream=True, include_usage=True,
        continuous_usage=True, logprobs=True, top_logprobs=2, token_ids=True,
        sampling=canonical.Sampling(n=2))
    return [openai_encode.ChatStreamEncoder(req, META), openai_encode.ChatStreamEncoder(
        req, META, True), openai_encode.CompletionStreamEncoder(req, META)] if not whole else []
