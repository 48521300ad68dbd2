"""In-prompt directives, so a test in any client protocol can make the simulated worker misbehave.

Syntax: `[[sim key=value flag ...]]` anywhere in a completion prompt or a chat message's text;
several directives merge, later keys win. Keys: `tokens=N`, `ttft_ms=X`, `itl_ms=X`,
`reasoning[=N]`, `fail=STATUS`, `fail_times=K`, `drop_before`, `drop_after=N`, `hang_after=N`,
`error_after=N`, `finish=length|stop`. An unknown key or a bad value is a 400, so a typo in a
test fails loudly instead of silently doing nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

MARKER = "[[sim"
_DIRECTIVE = re.compile(r"\[\[sim(\s[^\]]*)?\]\]")
DEFAULT_REASONING_TOKENS = 4
_INTS = {"tokens", "fail", "fail_times", "drop_after", "hang_after", "error_after", "reasoning"}
_FLOATS = {"ttft_ms", "itl_ms"}
_FLAGS = {"reasoning": DEFAULT_REASONING_TOKENS, "drop_before": True}
_CHOICES = {"finish": ("length", "stop")}


class DirectiveError(ValueError):
    """A malformed directive; the server answers 400 with this message."""


@dataclass(frozen=True, slots=True)
class Directives:
    """The behaviour one request asked for; None means "use the server setting"."""

    tokens: int | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    reasoning: int | None = None  # reasoning tokens before the answer
    fail: int | None = None  # HTTP status to answer before any byte
    fail_times: int | None = None  # only the first K requests with this directive fail
    fail_key: str = ""  # the exact directive text that carries `fail`
    drop_before: bool = False
    drop_after: int | None = None
    hang_after: int | None = None
    error_after: int | None = None
    finish: str | None = None

    @property
    def cut_after(self) -> int | None:
        """Steps streamed before the earliest stream fault, if any."""
        cuts = [c for c in (self.drop_after, self.hang_after, self.error_after) if c is not None]
        return min(cuts) if cuts else None


NONE = Directives()
_NAMES = {f.name for f in fields(Directives)} - {"fail_key"}


def _value(key: str, raw: str | None) -> Any:
    """Parse one `key=value` (or bare flag) into its typed value."""
    if key not in _NAMES:
        raise DirectiveError(f"unknown simulator directive `{key}`")
    if raw is None:
        if key not in _FLAGS:
            raise DirectiveError(f"simulator directive `{key}` needs a value")
        return _FLAGS[key]
    try:
        if key in _INTS:
            value: Any = int(raw)
        elif key in _FLOATS:
            value = float(raw)
        else:
            value = raw
    except ValueError:
        raise DirectiveError(f"bad value for simulator directive `{key}`: {raw!r}") from None
    if key in _CHOICES and value not in _CHOICES[key]:
        raise DirectiveError(f"`{key}` must be one of {', '.join(_CHOICES[key])}")
    if isinstance(value, (int, float)) and value < 0:
        raise DirectiveError(f"`{key}` must not be negative")
    if key == "fail" and not 400 <= value <= 599:
        raise DirectiveError("`fail` must be an HTTP error status (400-599)")
    return value


def _parse_one(text: str, body: str) -> dict[str, Any]:
    """The keys of one `[[sim ...]]` occurrence."""
    found: dict[str, Any] = {}
    for item in body.split():
        key, sep, raw = item.partition("=")
        found[key] = _value(key, raw if sep else None)
    if "fail" in found:
        found["fail_key"] = text
    return found


def parse(texts: Iterable[str]) -> Directives:
    """Merge every directive found in `texts` (cheap when there is none)."""
    merged: dict[str, Any] = {}
    for text in texts:
        if MARKER not in text:
            continue
        for m in _DIRECTIVE.finditer(text):
            merged.update(_parse_one(m.group(0), m.group(1) or ""))
    return replace(NONE, **merged) if merged else NONE


class FailMemory:
    """Counts requests per `fail` directive text, for `fail_times`; reset by /_sim/reset."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def should_fail(self, d: Directives) -> bool:
        """Whether this request fails now (and count it)."""
        if d.fail is None:
            return False
        if d.fail_times is None:
            return True
        seen = self._seen.get(d.fail_key, 0)
        self._seen[d.fail_key] = seen + 1
        return seen < d.fail_times

    def reset(self) -> None:
        """Forget every count."""
        self._seen.clear()
