"""Parsing of `[[sim ...]]` directives and the `fail_times` memory."""

from __future__ import annotations

import pytest

from simulator import directives
from simulator.directives import DirectiveError, Directives, FailMemory


def test_no_directive_is_the_shared_default() -> None:
    assert directives.parse(["hello", "no [sim here]]"]) is directives.NONE
    assert directives.parse([]).cut_after is None


def test_keys_values_and_flags_are_typed() -> None:
    d = directives.parse(
        [
            "say hi [[sim tokens=7 ttft_ms=12.5 itl_ms=3 reasoning finish=length]] please",
        ]
    )
    assert (d.tokens, d.ttft_ms, d.itl_ms, d.reasoning, d.finish) == (7, 12.5, 3.0, 4, "length")
    assert directives.parse(["[[sim reasoning=2]]"]).reasoning == 2
    assert directives.parse(["[[sim drop_before]]"]).drop_before is True
    assert directives.parse(["[[sim]]"]) == Directives()


def test_directives_merge_across_messages_later_wins() -> None:
    d = directives.parse(
        ["[[sim tokens=3 itl_ms=1]]", "x", "[[sim tokens=9]] and [[sim hang_after=2]]"]
    )
    assert (d.tokens, d.itl_ms, d.hang_after) == (9, 1.0, 2)


def test_fail_key_is_the_exact_directive_text() -> None:
    d = directives.parse(["before [[sim fail=503  fail_times=2]] after"])
    assert (d.fail, d.fail_times, d.fail_key) == (503, 2, "[[sim fail=503  fail_times=2]]")


def test_cut_after_is_the_earliest_stream_fault() -> None:
    assert directives.parse(["[[sim drop_after=5 error_after=3]]"]).cut_after == 3
    assert directives.parse(["[[sim hang_after=0]]"]).cut_after == 0


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[sim tokenz=3]]", "unknown simulator directive `tokenz`"),
        ("[[sim tokens=abc]]", "bad value for simulator directive `tokens`"),
        ("[[sim tokens]]", "`tokens` needs a value"),
        ("[[sim finish=eos]]", "`finish` must be one of length, stop"),
        ("[[sim fail=200]]", "`fail` must be an HTTP error status"),
        ("[[sim itl_ms=-1]]", "`itl_ms` must not be negative"),
    ],
)
def test_bad_directives_raise_with_a_message(text: str, message: str) -> None:
    with pytest.raises(DirectiveError, match=message.replace("(", r"\(")):
        directives.parse([text])


def test_fail_times_counts_per_directive_text_and_resets() -> None:
    mem = FailMemory()
    a = directives.parse(["[[sim fail=503 fail_times=2]]"])
    b = directives.parse(["[[sim fail=500 fail_times=1]]"])
    assert [mem.should_fail(a) for _ in range(3)] == [True, True, False]
    assert [mem.should_fail(b) for _ in range(2)] == [True, False]
    mem.reset()
    assert mem.should_fail(a) is True


def test_fail_without_times_always_fails_and_no_fail_never() -> None:
    mem = FailMemory()
    always = directives.parse(["[[sim fail=500]]"])
    assert all(mem.should_fail(always) for _ in range(3))
    assert mem.should_fail(directives.NONE) is False
