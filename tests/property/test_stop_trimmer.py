"""Hypothesis: the stop-string trimmer (adapters/backends/stops.py) for workers that keep the
matched string in their text (TGI's StopSequenceCriteria, TensorRT-LLM's stop words: generation
ends right after the match, so the text ends with it and holds no earlier match).

Whatever the deltas' boundaries (a stop string split over 2 or 3 deltas, stop strings that are
prefixes of one another, several of them, multi-byte characters around them):
- what is released before the end never contains text that a stop string may still claim;
- at the end the text is the worker's less the first stop string (client order) it ends with,
  as vLLM answers (it checks the stop strings in order);
- no delta's token ids or logprobs are lost, and `keep` passes every delta through at once.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.backends import stops
from schemas import events as ev

ALPHABET = "ab\u00e9\u4e2d\U0001f600 "
stop_lists = st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3)


def first_match(text: str, stop_list: list[str]) -> int:
    return min((text.find(s) for s in stop_list if s in text), default=-1)


def deltas_of(text: str, cuts: list[int]) -> list[ev.TextDelta]:
    points = sorted({0, len(text), *cuts})
    return [ev.TextDelta(0, text[a:b], [k], None)
            for k, (a, b) in enumerate(zip(points, points[1:]))]


@settings(max_examples=500)
@given(stop_lists, st.text(ALPHABET, max_size=10), st.data())
def test_released_text_is_the_workers_less_the_matched_stop(
        stop_list: list[str], body: str, data: st.DataObject) -> None:
    end = data.draw(st.sampled_from([*stop_list, ""]))
    text = body + end
    hit = first_match(text, stop_list)
    # a worker that keeps stop strings ends at the first match: its text holds no earlier one
    if hit >= 0 and not any(text.endswith(s) and hit == len(text) - len(s) for s in stop_list):
        return
    parts = deltas_of(text, data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    trim = stops.StopTrimmer(stop_list)
    released = ""
    for d in parts:
        released += "".join(x.text for x in trim.push(d))
        # what went out can no longer be (the start of) a stop string reaching into later text
        assert first_match(released, stop_list) < 0 or released == text
    matched = trim.matched()
    out = trim.release(matched)
    final = released + "".join(x.text for x in out)
    want = next((s for s in stop_list if text.endswith(s)), None)
    assert matched == want
    assert final == (text[:len(text) - len(want)] if want else text)


@given(stop_lists, st.text(ALPHABET, max_size=10), st.lists(st.integers(0, 10), max_size=5))
def test_no_tokens_are_lost_and_keep_passes_everything_at_once(
        stop_list: list[str], text: str, cuts: list[int]) -> None:
    parts = deltas_of(text, cuts)
    trim = stops.StopTrimmer(stop_list)
    out = [x for d in parts for x in trim.push(d)]
    out += trim.release(trim.matched())
    assert [x.token_ids for x in out] == [d.token_ids for d in deltas_of(text, cuts)]
    kept = stops.StopTrimmer(stop_list, keep=True)
    again = deltas_of(text, cuts)
    assert [kept.push(d) for d in again] == [[d] for d in again]
