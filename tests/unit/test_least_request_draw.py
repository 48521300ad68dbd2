"""`least_request`'s power of two choices draws two distinct upstreams uniformly (as
`random.sample(urls, 2)` did, without its Python-level checks): the lighter goes first, so an
upstream heavier than every other is never first, and with equal loads each is first as
often as any other."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import balancer


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_heaviest_upstream_is_never_the_first_choice(n: int) -> None:
    urls = [f"http://10.0.0.{i}:8000" for i in range(n)]
    ups = balancer.Upstreams(tuple(urls), "least_request")
    for heavy in urls:
        for u in urls:
            ups.health[u].in_flight = 9 if u == heavy else 1
        firsts = {ups.order()[0] for _ in range(300)}
        assert heavy not in firsts
        assert sorted(ups.order()) == sorted(urls)  # every upstream once


def test_with_equal_loads_every_upstream_is_first_as_often() -> None:
    random.seed(5)
    urls = [f"http://10.0.0.{i}:8000" for i in range(4)]
    ups = balancer.Upstreams(tuple(urls), "least_request")
    firsts = Counter(ups.order()[0] for _ in range(20_000))
    assert set(firsts) == set(urls)
    assert all(abs(c / 20_000 - 0.25) < 0.02 for c in firsts.values()), firsts


def test_the_two_drawn_are_every_pair_alike() -> None:
    """The draw itself: with every load different, the first choice is the lighter of the
    pair drawn, so each upstream is first as often as the pairs it is the lighter of: of
    three upstreams, the lightest in two pairs of three, the middle one in one, the heaviest
    in none. (Equal loads show the first drawn is uniform: the test above.)"""
    random.seed(11)
    urls = [f"http://10.0.0.{i}:8000" for i in range(3)]
    ups = balancer.Upstreams(tuple(urls), "least_request")
    for k, u in enumerate(urls):
        ups.health[u].in_flight = k
    firsts = Counter(ups.order()[0] for _ in range(12_000))
    assert firsts[urls[2]] == 0
    assert abs(firsts[urls[0]] / 12_000 - 2 / 3) < 0.02, firsts
    assert abs(firsts[urls[1]] / 12_000 - 1 / 3) < 0.02, firsts


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 2.0])), min_size=2,
                max_size=20), st.integers(0, 2**32))
def test_after_the_first_choice_the_rest_go_lightest_first(
        loads: list[tuple[int, float]], seed: int) -> None:
    """A retry goes to the lightest of the upstreams not yet tried: every upstream once, the
    first the lighter of the two drawn, then the rest by in-flight count plus the worker's
    queue, ties in the configured order (what `sorted` by load gives)."""
    random.seed(seed)
    urls = [f"http://10.0.0.{i}:8000" for i in range(len(loads))]
    ups = balancer.Upstreams(tuple(urls), "least_request")
    load = {}
    for u, (in_flight, queued) in zip(urls, loads):
        ups.health[u].in_flight, ups.health[u].queued = in_flight, queued
        load[u] = in_flight + queued
    order = ups.order()
    assert sorted(order) == sorted(urls)
    assert order[1:] == sorted(order[1:], key=lambda u: (load[u], urls.index(u)))
    assert sum(load[u] < load[order[0]] for u in urls) <= len(urls) - 2  # never the heaviest of all


@pytest.mark.parametrize("n", [balancer.SORT_ABOVE, balancer.SORT_ABOVE + 1, 40])
def test_many_upstreams_are_ranked_alike(n: int) -> None:
    """Above `SORT_ABOVE` the rest are ranked by `sorted`, below by the insertion sort: the
    same order either way (by load, ties in configured order)."""
    rng = random.Random(n)
    urls = [f"http://10.0.0.{i}:8000" for i in range(n)]
    ups = balancer.Upstreams(tuple(urls), "least_request")
    load = {}
    for u in urls:
        ups.health[u].in_flight = rng.randrange(4)
        load[u] = ups.health[u].in_flight
    for _ in range(50):
        order = ups.order()
        assert sorted(order) == sorted(urls)
        assert order[1:] == sorted(order[1:], key=lambda u: (load[u], urls.index(u)))
