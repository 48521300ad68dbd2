"""Parameter tables for workers whose API is not OpenAI's (Triton, TGI): data, not if-chains.

Every canonical field a client protocol can set (each `Sampling` field, the request options in
`REQUEST_FIELDS`, and the protocol extras a front end passes on) has one rule per worker kind:
`Send` it under the worker's name, `Translate` a value the worker would refuse into what means
the same to it (TGI: temperature 0 is `do_sample: false`), `Own` it (the backend itself honours
it: a chat template, a prepended echo), `Drop` it with a log line (no effect on this worker's
answer), or `Refuse` it with a 400 naming the field. A field without a rule is refused, so a new
canonical field cannot slip through unnoticed; `noop` values are taken silently whatever the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from schemas import canonical, errors

_log: Any = structlog.get_logger("gateway")

_NOTHING = object()


@dataclass(frozen=True, slots=True)
class Send:
    """Sent as is, under the worker's name."""

    key: str
    noop: Any = _NOTHING


@dataclass(frozen=True, slots=True)
class Translate:
    """`fn(value)` gives the worker fields to set ({} for none); it raises for a value that has
    no meaning to this worker."""

    fn: Callable[[Any], dict[str, Any]]
    noop: Any = _NOTHING


@dataclass(frozen=True, slots=True)
class Own:
    """Honoured by the backend or its decoder, not sent as a field."""

    how: str
    noop: Any = _NOTHING


@dataclass(frozen=True, slots=True)
class Drop:
    """Has no effect on this worker's answer; dropped with a log line."""

    why: str
    noop: Any = _NOTHING


@dataclass(frozen=True, slots=True)
class Refuse:
    """The worker cannot do it: a 400 naming the field."""

    why: str
    noop: Any = _NOTHING


Rule = Send | Translate | Own | Drop | Refuse
Table = Mapping[str, Rule]

# The options of a request besides its sampling, with the value that means "not asked for".
REQUEST_FIELDS: dict[str, Any] = {
    "logprobs": False, "top_logprobs": 0, "prompt_logprobs": None, "token_ids": False,
    "per_token": False, "echo": False, "tools": None, "tool_choice": None,
    "parallel_tool_calls": None, "response_format": None, "reasoning_effort": None, "user": None,
}
# Sampling fields whose unset value is not None.
_SAMPLING_UNSET: dict[str, Any] = {"stop": [], "stop_token_ids": [], "n": 1,
                                   "max_tokens_fit": False, "keep_stop": False}


def asked(req: canonical.InferenceRequest) -> Iterator[tuple[str, Any]]:
    """Every canonical field the client set: sampling, then request options, then extras."""
    for name in canonical.Sampling.__slots__:
        value = getattr(req.sampling, name)
        if value is not None and value != _SAMPLING_UNSET.get(name):
            yield name, value
    for name, unset in REQUEST_FIELDS.items():
        value = getattr(req, name)
        if value != unset:
            yield name, value
    yield from req.extra.items()


def refuse(name: str, why: str, worker: str) -> errors.Unsupported:
    return errors.Unsupported(f"`{name}` is not supported by this model's worker ({worker}): "
                              f"{why}", field=name)


def apply(table: Table, req: canonical.InferenceRequest, worker: str,
          out: dict[str, Any] | None = None, unknown: Rule | None = None) -> None:
    """Check every asked field against `table`; with `out`, also write the worker's fields
    (and log the drops, once per request). `unknown` rules extras that have no entry."""
    for name, value in asked(req):
        rule = table.get(name)
        if rule is None:
            rule = unknown if unknown is not None and name in req.extra else \
                Refuse("this worker has no such parameter")
        if value is None or value == rule.noop:
            continue
        match rule:
            case Send():
                if out is not None:
                    out[rule.key] = value
            case Translate():
                fields = rule.fn(value)
                if out is not None:
                    out.update(fields)
            case Own():
                pass
            case Drop():
                if out is not None:
                    _log.info("parameter_dropped", worker=worker, field=name, why=rule.why)
            case Refuse():
                raise refuse(name, rule.why, worker)


def covers(table: Table, *, extras: tuple[str, ...] = ()) -> list[str]:
    """The canonical fields `table` has no rule for (a test keeps this empty)."""
    names = [*canonical.Sampling.__slots__, *REQUEST_FIELDS, *extras]
    return [n for n in names if n not in table]


def invalid(name: str, message: str) -> errors.InvalidRequest:
    """A value out of the worker's range that no translation can save: "`top_p` must ..."."""
    return errors.InvalidRequest(f"`{name}` {message}", field=name)
