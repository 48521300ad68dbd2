"""A worker's JSON values of the types the canonical events declare, or a TypeError.

The decoders turn a TypeError into the worker's malformed answer (decoder.malformed), so a
value of another JSON type never reaches an event: the encoders trust the events' types (the
compiled build's check them as they read, tests/unit/test_event_types.py)."""

from __future__ import annotations

from typing import Any


def _wrong(what: str, value: Any, want: str) -> TypeError:
    return TypeError(f"{what} is {type(value).__name__}, not {want}")


def string(value: Any, what: str) -> str:
    if type(value) is not str:
        raise _wrong(what, value, "a string")
    return value


def optional_string(value: Any, what: str) -> str | None:
    return None if value is None else string(value, what)


def integer(value: Any, what: str) -> int:
    if not isinstance(value, int):
        raise _wrong(what, value, "an integer")
    return value


def optional_integer(value: Any, what: str) -> int | None:
    return None if value is None else integer(value, what)


def number(value: Any, what: str) -> float:
    if not isinstance(value, int | float):
        raise _wrong(what, value, "a number")
    return value


def optional_number(value: Any, what: str) -> float | None:
    return None if value is None else number(value, what)


def integers(value: Any, what: str) -> list[int] | None:
    """A list of integers (token ids, a token's bytes), or None."""
    if value is None:
        return None
    if type(value) is not list or not all(isinstance(v, int) for v in value):
        raise _wrong(what, value, "a list of integers")
    return value


def matched(value: Any) -> str | int | None:
    """A finish's stop string or stop token id; any other value names none."""
    return value if isinstance(value, str | int) else None
