"""adapters.backends.params: `asked` (fields found by `map(operator.ne)` and `compress`) and
`ordered` (one walk of a table-ordered plan) give exactly what their earlier forms gave, a
Python loop over every field and a walk of the table, for any request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from adapters import registry
from adapters.backends import openai, params
from schemas import canonical, errors


def asked_before(req: canonical.InferenceRequest) -> Iterator[tuple[str, Any, bool]]:
    for name, value, unset in zip(params._SAMPLING_NAMES, params._sampling_values(req.sampling),
                                  params._SAMPLING_UNSETS, strict=True):
        if value is not None and value != unset:
            yield name, value, False
    for name, value, unset in zip(params._REQUEST_NAMES, params._request_values(req),
                                  params._REQUEST_UNSETS, strict=True):
        if value != unset:
            yield name, value, False
    for name, value in req.extra.items():
        yield name, value, True


def ordered_before(planned: params.Plan, names: Any) -> dict[str, Any]:
    fields = {name: f for name, extra, f in planned if not extra}
    out: dict[str, Any] = {}
    for name in names:
        if name in fields:
            out.update(fields[name])
    return out


# each field: unset (None or its unset value), a value equal to the unset one in another type
# (0 for False, 0.0 for 0), or a set value
value = st.one_of(st.none(), st.just(0), st.just(0.0), st.just(False), st.just(1), st.just([]),
                  st.integers(-3, 300), st.floats(allow_nan=False, allow_infinity=False),
                  st.lists(st.text(max_size=3), max_size=2), st.booleans(),
                  st.dictionaries(st.text(max_size=3), st.floats(-1, 1), max_size=2))
sampling = st.fixed_dictionaries({}, optional={n: value for n in params._SAMPLING_NAMES})
options = st.fixed_dictionaries({}, optional={n: value for n in params._REQUEST_NAMES})
extras = st.dictionaries(st.sampled_from(["max_tokens", "suffix", "store", "api_key", "top_k",
                                          "bad_words", "x"]), value, max_size=3)


def request(s: dict[str, Any], o: dict[str, Any], e: dict[str, Any],
            chat: bool) -> canonical.InferenceRequest:
    return canonical.InferenceRequest(
        model="m", messages=[canonical.Message("user", "hi")] if chat else None,
        prompts=None if chat else ["hi"], sampling=canonical.Sampling(**s), extra=e, **o)


@settings(max_examples=200, deadline=None)
@given(s=sampling, o=options, e=extras, chat=st.booleans())
def test_asked_is_what_the_loop_gave(s: dict[str, Any], o: dict[str, Any], e: dict[str, Any],
                                     chat: bool) -> None:
    req = request(s, o, e, chat)
    assert params.asked(req) == list(asked_before(req))


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["openai", "vllm", "trtllm"]), s=sampling, o=options, e=extras,
       chat=st.booleans())
def test_ordered_is_what_the_table_walk_gave(kind: str, s: dict[str, Any], o: dict[str, Any],
                                             e: dict[str, Any], chat: bool) -> None:
    backend: Any = registry.backend(kind)
    req = request(s, o, e, chat)
    try:  # values of any type: a translation may refuse one (its request is not built)
        planned = params.plan(backend.TABLE, req, backend.WORKER, backend.UNKNOWN_EXTRA,
                              extras=backend.EXTRAS, table_order=True, log=False, check=False)
    except (TypeError, AttributeError, ValueError, errors.GatewayError):
        assume(False)
    for names in (backend.SAMPLING, backend.OPTIONS):
        assert params.ordered(planned, names) == ordered_before(planned, names)
        assert list(params.ordered(planned, names)) == list(ordered_before(planned, names))


@pytest.mark.parametrize("kind", sorted(registry.BACKENDS))
def test_a_table_is_its_sampling_part_then_its_options(kind: str) -> None:
    """What `ordered` relies on: a plan in table order is in each part's order."""
    cls: Any = registry.BACKENDS[kind]
    if not issubclass(cls, openai.OpenAIBackend):
        return
    assert not cls.SAMPLING.keys() & cls.OPTIONS.keys()
    assert list(cls.TABLE) == [*cls.SAMPLING, *cls.OPTIONS]
