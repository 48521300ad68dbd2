"""Hypothesis: a streamed answer says what the same events folded into a whole answer say
(STYLE.md section 2: non-streaming is `Completion.fold(events)`, as TGI's generate folds its
stream), for interleaved choices, reasoning and tool-call fragments, read as a client does.

OpenAI: a client accumulates chunks per `index` (openai-python's ChatCompletionStreamState:
content and reasoning appended, tool calls by their `index`, arguments appended); the result
is the whole chat.completion body of the fold, choice by choice, with the usage.

TGI: the last /generate_stream event (generated_text, details) and the tokens of all events are
/generate's body for the same events, whatever the upstream reads.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import base
from adapters.frontends import openai as frontend
from adapters.frontends import openai_encode, tgi
from schemas import canonical
from schemas import events as ev

META = base.ResponseMeta("x", 1, "m")
CTX = base.RequestContext()
BODY = (b'{"model":"m","messages":[{"role":"user","content":"q"}],"stream":true,"n":2,'
        b'"stream_options":{"include_usage":true}}')

texts = st.text(min_size=1, max_size=5)
piece = st.one_of(st.tuples(st.just("text"), texts), st.tuples(st.just("reasoning"), texts),
                  st.tuples(st.just("call"), st.tuples(st.integers(0, 2), texts)))
reasons = st.sampled_from(["eos", "stop_string", "length", "tool_calls", "content_filter"])


def choice_events(i: int, pieces: list[tuple[str, Any]], reason: str) -> list[ev.Event]:
    """One choice's events; a call's first fragment has its id and name (ToolCallDelta)."""
    out: list[ev.Event] = []
    named: set[int] = set()
    for kind, value in pieces:
        if kind == "text":
            out.append(ev.TextDelta(i, value))
        elif kind == "reasoning":
            out.append(ev.ReasoningDelta(i, value))
        else:
            index, args = value
            first = index not in named
            named.add(index)
            out.append(ev.ToolCallDelta(i, index, f"call_{i}_{index}" if first else None,
                                        "f" if first else None, args))
    out.append(ev.Finish(i, reason))  # type: ignore[arg-type]
    return out


def interleave(a: list[ev.Event], b: list[ev.Event], order: list[bool]) -> list[ev.Event]:
    out: list[ev.Event] = []
    ia = ib = 0
    for take_a in order + [True] * len(a) + [False] * len(b):
        if take_a and ia < len(a):
            out.append(a[ia])
            ia += 1
        elif not take_a and ib < len(b):
            out.append(b[ib])
            ib += 1
    return out


def accumulate(wire: bytes) -> dict[str, Any]:
    """The answer a client builds from the chunks (`choices` by index, and the usage)."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    blocks = wire.split(b"\n\n")
    assert blocks[-2:] == [b"data: [DONE]", b""]
    for block in blocks[:-2]:
        chunk = orjson.loads(block.removeprefix(b"data: "))
        usage = chunk["usage"] or usage
        for c in chunk["choices"]:
            got = choices.setdefault(c["index"], {"content": "", "reasoning": None, "calls": [],
                                                  "finish": None})
            assert got["finish"] is None  # nothing after a choice's finish
            d = c["delta"]
            got["content"] += d.get("content") or ""
            if "reasoning_content" in d:
                got["reasoning"] = (got["reasoning"] or "") + d["reasoning_content"]
            for t in d.get("tool_calls") or ():
                while len(got["calls"]) <= t["index"]:
                    got["calls"].append({"id": "", "name": "", "arguments": ""})
                call = got["calls"][t["index"]]
                call["id"] = t.get("id") or call["id"]
                call["name"] += t["function"].get("name") or ""
                call["arguments"] += t["function"]["arguments"]
            got["finish"] = c["finish_reason"]
    return {"choices": choices, "usage": usage}


@settings(max_examples=300)
@given(st.lists(piece, max_size=6), st.lists(piece, max_size=6), reasons, reasons,
       st.lists(st.booleans(), max_size=14), st.integers(0, 50), st.integers(0, 50))
def test_openai_chat_stream_says_what_its_fold_says(
        a: list[tuple[str, Any]], b: list[tuple[str, Any]], ra: str, rb: str,
        order: list[bool], prompt: int, completion: int) -> None:
    events = interleave(choice_events(0, a, ra), choice_events(1, b, rb), order)
    events.append(ev.Usage(prompt, completion))
    t = frontend.OpenAIChatFrontend().parse(BODY, CTX)
    enc = t.encoder(META)
    streamed = accumulate(b"".join(enc.encode(e) for e in events) + enc.finish())
    whole = openai_encode.chat_body(t.request, canonical.Completion.fold(events, 2), META)
    assert streamed["usage"] == whole["usage"]
    assert sorted(streamed["choices"]) == [c["index"] for c in whole["choices"]] == [0, 1]
    for c in whole["choices"]:
        got, msg = streamed["choices"][c["index"]], c["message"]
        assert got["content"] == (msg["content"] or "")
        assert got["reasoning"] == msg.get("reasoning_content")
        assert got["calls"] == [{"id": x["id"], "name": x["function"]["name"],
                                 "arguments": x["function"]["arguments"]}
                                for x in msg.get("tool_calls") or ()]
        assert got["finish"] == c["finish_reason"]


# ---- TGI: /generate_stream against /generate of the same events ----

tgi_tokens = st.lists(st.tuples(st.text("ab \u00e9\U0001f600", max_size=3),
                                st.floats(-20, 0, allow_nan=False)), min_size=1, max_size=8)


@settings(max_examples=200)
@given(tgi_tokens, st.lists(st.integers(1, 3), min_size=8, max_size=8),
       st.lists(st.booleans(), min_size=10, max_size=10),
       st.sampled_from(["eos", "length", "stop_string", "stop_token"]), st.booleans())
def test_tgi_stream_says_what_generate_says(toks: list[tuple[str, float]], sizes: list[int],
                                            reads: list[bool], reason: str,
                                            finish_alone: bool) -> None:
    """The last /generate_stream event's generated_text and details, and the tokens of all
    events, are /generate's for the same events, whatever the upstream reads (a Finish in a
    read of its own, usage after it)."""
    params = {"details": True, "max_new_tokens": 50, "stop": ["STOP"]}
    events: list[ev.Event] = []
    i = 0
    for size in sizes:
        part = toks[i:i + size]
        if not part:
            break
        events.append(ev.TextDelta(0, "".join(t for t, _ in part),
                                   list(range(i, i + len(part))),
                                   [ev.TokenLogprob(t, lp) for t, lp in part]))
        i += size
    matched = "STOP" if reason == "stop_string" else None
    events += [ev.Finish(0, reason, matched), ev.Usage(4, len(toks))]  # type: ignore[arg-type]
    stream_t = tgi.TgiFrontend("stream").parse(
        orjson.dumps({"inputs": "Hi", "parameters": params}), CTX)
    enc = stream_t.encoder(META)
    wire = b""
    for k, e in enumerate(events):
        wire += enc.encode(e)
        if reads[k % len(reads)] or (finish_alone and isinstance(e, ev.TextDelta)):
            wire += enc.flush()
    wire += enc.flush() + enc.finish()
    sent = [orjson.loads(x.removeprefix(b"data: ")) for x in wire.split(b"\n\n") if x]
    whole_t = tgi.TgiFrontend("generate").parse(
        orjson.dumps({"inputs": "Hi", "parameters": params}), CTX)
    whole = orjson.loads(whole_t.render(canonical.Completion.fold(events, 1, True), META).body)
    last = sent[-1]
    assert last["generated_text"] == whole["generated_text"]
    assert last["details"]["finish_reason"] == whole["details"]["finish_reason"]
    assert last["details"]["generated_tokens"] == whole["details"]["generated_tokens"]
    # every token /generate lists, in order (a stand-in empty special token may end a stream
    # whose Finish came in a read of its own)
    streamed = [e["token"] for e in sent]
    if streamed[-1] == {"id": -1, "text": "", "logprob": None, "special": True}:
        streamed.pop()
    assert streamed == whole["details"]["tokens"]
