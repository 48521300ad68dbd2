"""Parameter tables of every worker kind (OpenAI, vLLM, trtllm-serve, Triton, TGI): data, not
if-chains.

Every canonical field a client protocol can set (each `Sampling` field, the request options in
`REQUEST_FIELDS`, and the protocol extras a front end passes on) has one rule per worker kind:
`Send` it under the worker's name, `Translate` a value the worker would refuse into what means
the same to it (TGI: temperature 0 is `do_sample: false`), `Own` it (the backend itself honours
it: a chat template, a prepended echo), `Drop` it with a log line (no effect on this worker's
answer), or `Refuse` it with a 400 naming the field. A field without a rule is refused, so a new
canonical field cannot slip through unnoticed; `noop` values are taken silently whatever the rule.
A request's extras are looked up in the same table; those a worker has no rule for get its
`unknown` rule, and `accepted_extras` lists the extras a table declares.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from schemas import canonical, errors

_log: Any = structlog.get_logger("gateway")

_NOTHING = object()


@dataclass(frozen=True, slots=True)
class Send:
    """Sent as is, under the worker's name (`key`; empty: the field's own name)."""

    key: str = ""
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
    """The worker cannot do it: a 400 naming the field. `message`, when given, is the whole
    text (`{name}` the field), for refusals whose wording predates the tables."""

    why: str
    noop: Any = _NOTHING
    message: str = ""


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


_SAMPLING_NAMES: Final = tuple(canonical.Sampling.__slots__)
_SAMPLING_UNSETS: Final = tuple(_SAMPLING_UNSET.get(name) for name in _SAMPLING_NAMES)
_sampling_values: Final = operator.attrgetter(*_SAMPLING_NAMES)
_REQUEST_NAMES: Final = tuple(REQUEST_FIELDS)
_REQUEST_UNSETS: Final = tuple(REQUEST_FIELDS.values())
_request_values: Final = operator.attrgetter(*_REQUEST_NAMES)


def asked(req: canonical.InferenceRequest) -> list[tuple[str, Any, bool]]:
    """Every field the client set: sampling, then request options, then extras (the third
    item: an extra, which may be named like a canonical field)."""
    # One attrgetter call per group, not a getattr per field; then a field is compared only
    # when it is not its unset value's very object (None, False, 0, 1: what an unset field
    # holds; a list unset is `[]`, another object). The names and unset values are Final:
    # C statics in the compiled build, whose loop reads them natively.
    out: list[tuple[str, Any, bool]] = []
    _set_fields(_sampling_values(req.sampling), _SAMPLING_NAMES, _SAMPLING_UNSETS, True, out)
    _set_fields(_request_values(req), _REQUEST_NAMES, _REQUEST_UNSETS, False, out)
    for name, value in req.extra.items():
        out.append((name, value, True))
    return out


def _set_fields(values: tuple[Any, ...], names: tuple[str, ...], unsets: tuple[Any, ...],
                none_unset: bool, out: list[tuple[str, Any, bool]]) -> None:
    """Each field not at its unset value (`none_unset`: None too, whatever that is)."""
    for i in range(len(values)):
        value = values[i]
        unset = unsets[i]
        if value is not unset and not (none_unset and value is None) and value != unset:
            out.append((names[i], value, False))


def refuse(name: str, why: str, worker: str) -> errors.Unsupported:
    return errors.Unsupported(f"`{name}` is not supported by this model's worker ({worker}): "
                              f"{why}", field=name)


# What each asked field becomes on the worker's wire: (name, is an extra, the worker's fields).
Plan = list[tuple[str, bool, dict[str, Any]]]


def plan(table: Table, req: canonical.InferenceRequest, worker: str,
         unknown: Rule | None = None, *, extras: Table | None = None, log: bool = True,
         table_order: bool = False, check: bool = True) -> Plan:
    """Check every asked field against `table` and say what each becomes, in the order asked
    (`table_order`: canonical fields in the table's order, then extras as asked). A refused
    field raises (without `check`, for a backend's `build` after its `check`, it is left out);
    with `log`, a dropped one is logged. Extras are looked up in `extras` when the
    worker keeps them apart (a client extra may be named like a canonical field), else in
    `table`; `unknown` rules those with no entry. An extra is refused by its presence, even
    null (as trtllm-serve's `extra="forbid"` does)."""
    out: Plan = []
    todo = asked(req)
    if table_order and len(todo) > 1:
        rank = _rank(table)
        todo.sort(key=lambda f: len(rank) + 1 if f[2] else rank.get(f[0], len(rank)))
    for name, value, extra in todo:
        rule = (extras if extra and extras is not None else table).get(name)
        if rule is None:
            rule = unknown if unknown is not None and extra else \
                Refuse("this worker has no such parameter")
        if (value is None and not (extra and isinstance(rule, Refuse))) or value == rule.noop:
            continue
        match rule:
            case Send():
                fields = {rule.key or name: value}
            case Translate():
                fields = rule.fn(value)
            case Own():
                fields = {}
            case Drop():
                fields = {}
                if log:
                    _log.info("parameter_dropped", worker=worker, field=name, why=rule.why)
            case Refuse():
                if not check:
                    continue
                if rule.message:
                    raise errors.Unsupported(rule.message.format(name=name), field=name)
                raise refuse(name, rule.why, worker)
        out.append((name, extra, fields))
    return out


_ranks: dict[int, tuple[Table, dict[str, int]]] = {}


def _rank(table: Table) -> dict[str, int]:
    """Each field's place in `table`, made once per table (tables are module constants)."""
    known = _ranks.get(id(table))
    if known is None or known[0] is not table:
        known = _ranks[id(table)] = (table, {name: i for i, name in enumerate(table)})
    return known[1]


def apply(table: Table, req: canonical.InferenceRequest, worker: str,
          out: dict[str, Any] | None = None, unknown: Rule | None = None) -> None:
    """Check every asked field against `table`; with `out`, also write the worker's fields
    in the order asked (and log the drops, once per request). `unknown` rules extras that
    have no entry."""
    for _, _, fields in plan(table, req, worker, unknown, log=out is not None):
        if out is not None:
            out.update(fields)


def ordered(planned: Plan, names: Mapping[str, Any]) -> dict[str, Any]:
    """The worker's fields of the canonical `names` (a table's part), in that order: a body's
    key order is its table's, whatever order the client wrote. `planned` is in table order
    (plan's `table_order`, the table being its parts one after the other: a test checks every
    backend's), so the plan is walked once, not the table."""
    out: dict[str, Any] = {}
    for name, extra, fields in planned:
        if not extra and name in names:
            out.update(fields)
    return out


def accepted_extras(table: Table, *, apart: bool = False) -> frozenset[str]:
    """The request extras `table` declares and does not refuse: the only ones a worker of this
    kind takes besides the canonical fields (no mass assignment of undeclared keys). `apart`:
    `table` holds extras only (plan's `extras`), so a canonical name in it is an extra too."""
    canonical_names = set() if apart else {*canonical.Sampling.__slots__, *REQUEST_FIELDS}
    return frozenset(n for n, rule in table.items()
                     if n not in canonical_names and not isinstance(rule, Refuse))


def covers(table: Table, *, extras: tuple[str, ...] = ()) -> list[str]:
    """The canonical fields `table` has no rule for (a test keeps this empty)."""
    names = [*canonical.Sampling.__slots__, *REQUEST_FIELDS, *extras]
    return [n for n in names if n not in table]


def invalid(name: str, message: str) -> errors.InvalidRequest:
    """A value out of the worker's range that no translation can save: "`top_p` must ..."."""
    return errors.InvalidRequest(f"`{name}` {message}", field=name)
