"""Hypothesis: the TGI front end under any input.

- Logprobs are written as TGI writes an f32 (serde_json's shortest round-trip digits): the
  value reads back as the same f32, and no shorter decimal does.
- Any split of a generation into deltas and tokens gives /generate_stream events that validate
  against TGI's StreamResponse, indexed 1..n, whose token texts join to generated_text, with
  generated_text and details only on the last (server.rs generate_stream_internal).
- Arbitrary JSON yields an InferenceRequest or InvalidRequest, nothing else.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from adapters import base
from adapters.frontends import tgi, tgi_encode
from schemas import canonical, errors
from schemas import events as ev
from schemas import tgi as wire

F32 = struct.Struct("<f")
CTX = base.RequestContext()


def as_f32(x: float) -> float:
    return float(F32.unpack(F32.pack(x))[0])


def shortest_digits(x: float) -> int:
    """The fewest significant digits that read back as the same f32 (the reference)."""
    y = as_f32(x)
    return next(p for p in range(1, 10) if as_f32(float(format(y, f".{p}g"))) == y)


def digits(v: float) -> int:
    """Significant digits as written (repr, like orjson, is the shortest double form)."""
    mantissa = repr(v).split("e")[0]
    return len(mantissa.replace("-", "").replace(".", "").lstrip("0").rstrip("0")) or 1


@given(st.floats(min_value=-1e30, max_value=1e30, allow_nan=False, allow_infinity=False))
def test_f32_logprob_is_the_shortest_round_trip(x: float) -> None:
    v = tgi_encode.f32(x)
    assert v is not None and as_f32(v) == as_f32(x)
    if v != 0:
        assert digits(v) == shortest_digits(x)
    assert orjson.loads(orjson.dumps(v)) == v


tokens = st.lists(st.tuples(st.text(max_size=4), st.floats(-20, 0, allow_nan=False)),
                  min_size=1, max_size=12)


@given(tokens, st.lists(st.integers(1, 3), min_size=12, max_size=12), st.booleans(),
       st.sampled_from(["eos", "length", "stop_string"]), st.booleans())
def test_stream_events_for_any_split(toks: list[tuple[str, float]], sizes: list[int],
                                     details: bool, reason: str, usage_first: bool) -> None:
    params = {"details": details, "max_new_tokens": 50}
    t = tgi.TgiFrontend("stream").parse(
        orjson.dumps({"inputs": "Hi", "parameters": params}), CTX)
    enc = t.encoder(base.ResponseMeta("x", 1, "m"))
    deltas, i = [], 0
    for size in sizes:
        part = toks[i:i + size]
        if not part:
            break
        i += size
        lps = [ev.TokenLogprob(t, lp) for t, lp in part]
        deltas.append(ev.TextDelta(0, "".join(t for t, _ in part),
                                   list(range(i - len(part), i)), lps))
    matched = "STOP" if reason == "stop_string" else None
    finish = ev.Finish(0, reason, matched)  # type: ignore[arg-type]
    tail: list[ev.Event] = [finish, ev.Usage(4, len(toks))]
    if usage_first:
        tail.reverse()
    out = b"".join(enc.encode(e) for e in [*deltas, *tail]) + enc.finish()
    events = [wire.StreamResponse.model_validate_json(e.removeprefix(b"data: "))
              for e in out.split(b"\n\n") if e]
    # SPEC.md: TGI keeps a matched stop sequence in generated_text and the last token; a
    # worker stripped this one, so a token of its own carries it
    count = len(toks) + (matched is not None)
    assert [e.index for e in events] == list(range(1, count + 1))
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    text = "".join(t for t, _ in toks)
    assert "".join(e.token.text for e in events) == text + (matched or "")
    assert events[-1].generated_text == text + (matched or "")
    assert (events[-1].details is not None) == details
    if events[-1].details is not None:
        assert events[-1].details.generated_tokens == count
        assert events[-1].details.input_length == 4


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=8)
param_names = st.sampled_from([
    "best_of", "temperature", "repetition_penalty", "frequency_penalty", "top_k", "top_p",
    "typical_p", "do_sample", "max_new_tokens", "return_full_text", "stop", "truncate",
    "watermark", "details", "decoder_input_details", "seed", "top_n_tokens", "grammar",
    "adapter_id"])
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"inputs": json_values | st.text(max_size=8)},
                          optional={"parameters": st.dictionaries(param_names, json_values,
                                                                  max_size=5),
                                    "stream": json_values}))


@given(bodies, st.sampled_from(["generate", "stream", "compat"]))
def test_any_json_is_a_request_or_invalid_request(body: Any, mode: tgi.Mode) -> None:
    try:
        req = tgi.TgiFrontend(mode).parse(json.dumps(body).encode(), CTX).request  # big ints too
    except errors.InvalidRequest as exc:
        r = tgi.TgiFrontend(mode).render_error(exc)
        assert r.status in (200, 400, 422)  # 400: axum's syntax rejection (NaN, Infinity)
        return
    assert isinstance(req, canonical.InferenceRequest) and req.prompts
