"""Hypothesis: the token-per-line streams (TGI `/generate_stream`, LMI rolling batch) write
one token entry for each of `TextDelta.per_token`'s tokens, whatever ids and log probs the
worker gave a delta (none, one, several, an empty list; log probs or not).

The encoders take a short path for a delta of one token (one id, or no ids and no log probs:
what a worker gives that returns no ids); this checks that path against `per_token`'s general
answer: the same ids, texts and log probs, indexed 1..n on TGI's lines (server.rs
generate_stream_internal), generated_text the deltas' text.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from adapters.frontends import lmi_encode, lmi_params, tgi_encode
from schemas import events as ev

UNKNOWN = -1
token_ids = st.one_of(st.none(), st.lists(st.integers(0, 50_000), max_size=3))
logprob = st.builds(ev.TokenLogprob, st.text(max_size=3), st.floats(-20, 0),
                    id=st.one_of(st.none(), st.integers(0, 50_000)))


@st.composite
def deltas(draw: st.DrawFn) -> list[ev.TextDelta]:
    out = []
    for _ in range(draw(st.integers(1, 6))):
        ids = draw(token_ids)
        lps = draw(st.one_of(st.none(), st.lists(logprob, min_size=len(ids or [None]),
                                                 max_size=len(ids or [None]))))
        text = "".join(lp.token for lp in lps) if lps and draw(st.booleans()) \
            else draw(st.text(max_size=4))
        out.append(ev.TextDelta(0, text, ids, lps))
    return out


def expected(batch: list[ev.TextDelta]) -> list[tuple[int, str, ev.TokenLogprob | None]]:
    return [t for e in batch for t in e.per_token(UNKNOWN)]


def lines(raw: bytes, prefix: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line.removeprefix(prefix)) for line in raw.split(b"\n") if line]


@given(deltas())
def test_tgi_lines_are_per_token(batch: list[ev.TextDelta]) -> None:
    enc = tgi_encode.StreamEncoder(tgi_encode.TgiState())
    raw = b"".join(enc.encode(e) for e in [*batch, ev.Finish(0, "length"), ev.Usage(1, 1)])
    raw += enc.flush() + enc.finish()  # one worker read: the last token carries the end
    got = lines(raw, b"data: ")
    want = expected(batch)
    assert [g["index"] for g in got] == list(range(1, len(want) + 1))
    assert [(g["token"]["id"], g["token"]["text"]) for g in got] == [
        (tid, text) for tid, text, _ in want]
    assert [g["token"]["logprob"] for g in got] == [
        tgi_encode.f32(lp.logprob) if lp is not None else None for _, _, lp in want]
    assert got[-1]["generated_text"] == "".join(e.text for e in batch)


@given(deltas())
def test_lmi_rolling_lines_are_per_token(batch: list[ev.TextDelta]) -> None:
    enc = lmi_encode.RollingStreamEncoder(lmi_params.LmiState("rolling", stream=True))
    raw = b"".join(enc.encode(e) for e in [*batch, ev.Finish(0, "length")])
    raw += enc.flush() + enc.finish()
    got = [g["token"] for g in lines(raw, b"")]
    want = expected(batch)
    assert [(g["id"], g["text"]) for g in got] == [
        (tid, lp.token if lp is not None and lp.token else text) for tid, text, lp in want]
    assert [g["log_prob"] for g in got] == [
        lp.logprob if lp is not None else None for _, _, lp in want]
