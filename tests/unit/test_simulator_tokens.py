"""The simulator's deterministic tokenizer and generation rules (vLLM v1 finish semantics)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from simulator import jobs, tokens
from simulator.settings import SimulatorSettings

KEY = tokens.digest("unit-test prompt")


def gen(**kw: object) -> tokens.Outcome:
    """Generate one choice for KEY with a GenSpec built from `kw`."""
    return tokens.generate(tokens.GenSpec(**kw), KEY, "chatcmpl-tool-x")  # type: ignore[arg-type]


def test_same_key_same_tokens_and_logprobs() -> None:
    a, b = gen(tokens=12), gen(tokens=12)
    assert [(t.id, t.text, t.logprob) for t in a.tokens] == [
        (t.id, t.text, t.logprob) for t in b.tokens
    ]
    assert a.content == b.content and a.content


def test_output_is_stable_across_processes() -> None:
    """blake2b, not Python's salted hash(): another interpreter with another hash seed agrees."""
    code = (
        "from simulator import tokens as t;"
        "print(t.generate(t.GenSpec(tokens=12), t.digest('unit-test prompt')).content)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert out.rstrip("\n") == gen(tokens=12).content


def test_seed_temperature_and_choice_change_output_but_greedy_ignores_seed() -> None:
    s, p = SimulatorSettings(), tokens.digest("p")
    base = jobs.choice_key(s, p, None, None, 0)
    assert jobs.choice_key(s, p, None, None, 0) == base
    assert jobs.choice_key(s, p, 7, None, 0) != base
    assert jobs.choice_key(s, p, None, 0.5, 0) != base
    assert jobs.choice_key(s, p, None, None, 1) != base
    assert jobs.choice_key(SimulatorSettings(seed=1), p, None, None, 0) != base
    greedy = jobs.choice_key(s, p, 1, 0, 0)
    assert jobs.choice_key(s, p, 2, 0.0, 3) == greedy  # temperature 0: seed and index ignored


def test_natural_end_is_eos_counted_with_stop_and_no_stop_reason() -> None:
    o = gen(tokens=5)
    assert [t.kind for t in o.tokens] == [tokens.CONTENT] * 5 + [tokens.EOS]
    assert o.tokens[-1].id == tokens.EOS_ID
    assert (o.finish_reason, o.stop_reason) == ("stop", None)
    assert o.content == "".join(t.text for t in o.tokens[:5])
    assert all(t.text in tokens.VOCAB for t in o.tokens[:5])


def test_max_tokens_cuts_with_length_and_is_checked_before_eos() -> None:
    assert (gen(tokens=5, max_tokens=3).finish_reason, len(gen(tokens=5, max_tokens=3).tokens)) == (
        "length",
        3,
    )
    at_eos = gen(tokens=5, max_tokens=6)  # the EOS is the 6th token: vLLM's length check wins
    assert (at_eos.finish_reason, len(at_eos.tokens)) == ("length", 6)
    assert gen(tokens=5, max_tokens=7).finish_reason == "stop"


def test_ignore_eos_runs_to_max_tokens() -> None:
    o = gen(tokens=5, max_tokens=40, ignore_eos=True)
    assert (o.finish_reason, len(o.tokens)) == ("length", 40)
    assert tokens.EOS_ID not in o.token_ids


def test_finish_length_directive_ends_naturally_without_eos() -> None:
    o = gen(tokens=5, finish="length")
    assert (o.finish_reason, len(o.tokens), o.stop_reason) == ("length", 5, None)
    assert o.content == gen(tokens=5).content


def test_stop_string_spanning_tokens_is_cut_and_reported() -> None:
    full = gen(tokens=10).content
    assert full is not None
    stop = full[9:13]  # crosses a token boundary in general
    o = gen(tokens=10, stop=("zzz-not-there", stop))
    assert (o.finish_reason, o.stop_reason) == ("stop", stop)
    assert o.content == full[: full.index(stop)]
    assert stop not in (o.content or "")
    assert "".join(d for d in o.deltas if d) == o.content  # streamed deltas add up


def test_stop_string_holdback_delays_text_that_may_start_a_stop() -> None:
    o = gen(tokens=10, stop=("qqqqqq",))  # never matches; 5 characters held back
    full = gen(tokens=10).content
    assert o.content == full and o.finish_reason == "stop"
    assert len("".join(d for d in o.deltas[:-1] if d)) == len(full or "") - 5
    assert "".join(d for d in o.deltas if d) == full


def test_stop_strings_completing_on_one_step_resolve_in_list_order() -> None:
    """vLLM's detokenizer checks the stop list in order, not by position in the text."""
    base = gen(tokens=10)
    full = base.content or ""
    end = sum(len(t.text) for t in base.tokens[:6])  # a token boundary: both complete here
    longer, shorter = full[end - 4 : end], full[end - 3 : end]
    assert full.index(longer) == end - 4 and full.index(shorter) == end - 3
    assert gen(tokens=10, stop=(shorter, longer)).content == full[: end - 3]
    assert gen(tokens=10, stop=(longer, shorter)).content == full[: end - 4]


def test_stop_token_id_stops_drops_its_text_but_counts_it() -> None:
    base = gen(tokens=8)
    target = base.tokens[3]
    o = gen(tokens=8, stop_token_ids=frozenset({target.id}))
    first = next(i for i, t in enumerate(base.tokens) if t.id == target.id)
    assert (o.finish_reason, o.stop_reason) == ("stop", target.id)
    assert len(o.tokens) == first + 1
    assert o.content == "".join(t.text for t in base.tokens[:first])


def test_reasoning_then_content_and_cut_inside_reasoning() -> None:
    o = gen(tokens=3, reasoning=2)
    kinds = [t.kind for t in o.tokens]
    assert kinds == [tokens.REASONING] * 2 + [tokens.THINK_END] + [tokens.CONTENT] * 3 + [
        tokens.EOS
    ]
    assert o.deltas[2] is None  # </think> sends no chunk
    assert o.reasoning == "".join(t.text for t in o.tokens[:2]) and o.content
    cut = gen(tokens=3, reasoning=2, max_tokens=2)
    assert (cut.finish_reason, cut.content, cut.reasoning) == ("length", None, o.reasoning)
    assert gen(tokens=3, reasoning=2, max_tokens=3).deltas[-1] == ""  # a final step still shows


def test_tool_call_arguments_are_json_from_property_keys() -> None:
    props = {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"enum": ["c", "f"]},
        "hot": {"type": "boolean"},
    }
    o = gen(tool=("get_weather", props))
    assert o.tool is not None and o.tool.name == "get_weather" and o.tool.id == "chatcmpl-tool-x"
    args = json.loads(o.tool.arguments)
    assert list(args) == list(props)
    assert isinstance(args["city"], str) and isinstance(args["days"], int)
    assert args["unit"] in ("c", "f") and isinstance(args["hot"], bool)
    assert o.tokens[0].kind == tokens.TOOL_HEAD and o.tokens[-1].kind == tokens.EOS
    assert "".join(t.text for t in o.tokens if t.kind == tokens.TOOL_ARGS) == o.tool.arguments
    assert sum(t.kind == tokens.TOOL_ARGS for t in o.tokens) >= 2
    assert o.content is None


def test_json_object_output_parses() -> None:
    assert set(json.loads(gen(tokens=4, json_props={}).content or "")) == {"answer"}
    schema = gen(json_props={"a": {"type": "integer"}, "b": {"type": "string"}})
    assert list(json.loads(schema.content or "")) == ["a", "b"]


def test_logprobs_are_negative_and_top_alternatives_decrease() -> None:
    o = gen(tokens=6)
    for t in o.tokens:
        top = t.top(4)
        assert len(top) == 4 and top[0] == (t.logprob_text, t.logprob) and t.logprob < 0
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert len({tok for tok, _ in top}) == 4
    assert o.tokens[-1].logprob_text == "</s>"
    assert o.tokens[0].top(0) == []


def test_tokenizer_counts_words_and_chat_overhead() -> None:
    assert tokens.encode("the of  unknownword")[:2] == [tokens.VOCAB_BASE, tokens.VOCAB_BASE + 1]
    assert len(tokens.encode("a b c d")) == 4
    ids = tokens.encode_chat([("system", "be brief"), ("user", "hi there you")])
    assert len(ids) == 1 + (2 + 2) + (3 + 2) + 1
    assert tokens.decode([tokens.BOS_ID, tokens.VOCAB_BASE, tokens.VOCAB_BASE + 1]) == " the of"


def test_include_stop_str_in_output_streams_whole_tokens_and_keeps_the_match() -> None:
    """vLLM v1/engine/detokenizer.py: stop_buffer_length is 0 with include_stop_str_in_output,
    so each delta is its token's text; StopChecker.check_stop_strings then truncates after the
    stop string, so the match stays in the text (and a token running past it is cut there)."""
    base = gen(tokens=10)
    full = base.content or ""
    stop = full[9:13]  # crosses a token boundary in general
    o = gen(tokens=10, stop=("qqqqqqqq", stop), include_stop=True)
    end = full.index(stop) + len(stop)
    assert (o.finish_reason, o.stop_reason, o.content) == ("stop", stop, full[:end])
    assert o.deltas[:-1] == [t.text for t in base.tokens[: len(o.deltas) - 1]]
    assert "".join(d for d in o.deltas if d) == full[:end]
    held = gen(tokens=10, stop=("qqqqqqqq",), include_stop=True)  # no match, nothing held
    assert held.deltas[:10] == [t.text for t in base.tokens[:10]]


def test_include_stop_str_in_output_keeps_a_stop_tokens_text() -> None:
    """v1 detokenizer update(): a stop-terminated step drops its last token's text only when
    include_stop_str_in_output is off."""
    base = gen(tokens=10)
    third = base.tokens[2]
    o = gen(tokens=10, stop_token_ids=frozenset({third.id}), include_stop=True)
    assert (o.finish_reason, o.stop_reason) == ("stop", third.id)
    assert o.content == "".join(t.text for t in base.tokens[:3])


def test_prompt_logprobs_shape_is_vllms() -> None:
    """v1/engine/logprobs.py _make_logprob_dict: the prompt token first with its own rank, then
    ranks 1..k with the token not repeated; nothing for the first prompt token."""
    ids = [tokens.BOS_ID, *tokens.encode("tell me about the sea")]
    steps = tokens.prompt_logprobs(ids, 3)
    assert steps[0] is None and len(steps) == len(ids)
    for cur, step in zip(ids[1:], steps[1:], strict=True):
        assert step is not None and step[0][0] == cur
        rank = step[0][2]
        assert [r for _, _, r in step[1:]] == [r for r in range(1, 4) if r != rank]
        assert len({i for i, _, _ in step}) == len(step)
        by_rank = sorted(step, key=lambda e: e[2])
        assert [lp for _, lp, _ in by_rank] == sorted((lp for _, lp, _ in step), reverse=True)
    assert tokens.prompt_logprobs(ids[:3], 3) == steps[:3]  # a prefix's logprobs do not change
