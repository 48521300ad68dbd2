"""A worker's JSON values of the types the canonical events declare, in the range the encoders
can write, or a TypeError or ValueError.

The decoders turn either into the worker's malformed answer (decoder.malformed), so a
value of another JSON type never reaches an event: the encoders trust the events' types (the
compiled build's check them as they read, tests/unit/test_event_types.py)."""

from __future__ import annotations

from typing import Any

# What orjson writes (and reads: a JSON integer outside it comes as a float).
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1
# A token count: an integer a JSON reader in any language keeps exact (2^53), so that sums
# of counts (a total, the tokens of several responses) stay writable too.
COUNT_MAX = 1 << 53


def _wrong(what: str, value: Any, want: str) -> TypeError:
    return TypeError(f"{what} is {type(value).__name__}, not {want}")


def string(value: Any, what: str) -> str:
    if type(value) is not str:
        raise _wrong(what, value, "a string")
    return value


def text(value: Any, what: str) -> str:
    """A text as workers write it: a string, or nothing (null, absent, "") as "". Run on
    every streamed chunk: the check is written out here, not a call to `string`."""
    if not value:
        return ""
    if type(value) is not str:
        raise _wrong(what, value, "a string")
    return value


def optional_string(value: Any, what: str) -> str | None:
    return None if value is None else string(value, what)


def integer(value: Any, what: str) -> int:
    # `type`, not `isinstance`: JSON's `true` is no integer. The pure build would write it
    # back as `true` and the compiled one, whose `int` takes a bool, as `1`.
    if type(value) is not int:
        raise _wrong(what, value, "an integer")
    return bounded(value, what)


def bounded(value: int, what: str) -> int:
    """An integer the encoders can write (one made by `int()` or a sum may be larger)."""
    if not INT_MIN <= value <= INT_MAX:
        raise ValueError(f"{what} is out of range ({value})")
    return value


def count(value: Any, what: str) -> int:
    """A token count as workers write it (a number, a numeric string; null or absent is 0):
    a whole number from 0 to 2^53."""
    n = int(value or 0)
    if not 0 <= n <= COUNT_MAX:
        raise ValueError(f"{what} is out of range ({n})")
    return n


def optional_count(value: Any, what: str) -> int | None:
    return None if value is None else count(integer(value, what), what)


def optional_integer(value: Any, what: str) -> int | None:
    return None if value is None else integer(value, what)


def number(value: Any, what: str) -> float:
    if type(value) is not float and type(value) is not int:  # (not a bool: as `integer`)
        raise _wrong(what, value, "a number")
    return value


def optional_number(value: Any, what: str) -> float | None:
    return None if value is None else number(value, what)


def integers(value: Any, what: str) -> list[int] | None:
    """A list of integers (token ids, a token's bytes), or None."""
    if value is None:
        return None
    if type(value) is not list:
        raise _wrong(what, value, "a list of integers")
    for v in value:
        integer(v, what)
    return value


def matched(value: Any) -> str | int | None:
    """A finish's stop string or stop token id; any other value (a bool, an integer no
    encoder can write) names none."""
    return value if type(value) is str else token_id(value)


def token_id(value: Any) -> int | None:
    """A token's id where a worker may leave it out: any value but an integer the encoders
    can write is none."""
    return value if type(value) is int and INT_MIN <= value <= INT_MAX else None
