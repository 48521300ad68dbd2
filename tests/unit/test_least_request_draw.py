"""`least_request`'s power of two choices draws two distinct upstreams uniformly (as
`random.sample(urls, 2)` did, without its Python-level checks): the lighter goes first, so an
upstream heavier than every other is never first, and with equal loads each is first as
often as any other."""

from __future__ import annotations

import random
from collections import Counter

import pytest

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


def test_the_two_drawn_are_every_ordered_pair_alike() -> None:
    """The draw itself: the pair (first drawn, second drawn) over many draws, each of the
    n * (n - 1) ordered pairs about equally often, never an upstream with itself."""
    random.seed(11)
    urls = [f"http://10.0.0.{i}:8000" for i in range(3)]
    seen: list[str] = []

    class Recorded(balancer.Upstreams):  # a subclass: a compiled instance's methods are fixed
        def _load(self, url: str) -> float:
            seen.append(url)
            return 0.0

    ups = Recorded(tuple(urls), "least_request")
    pairs: Counter[tuple[str, str]] = Counter()
    for _ in range(12_000):
        seen.clear()
        ups.order()
        pairs[(seen[0], seen[1])] += 1  # the two loads compared, a then b
    assert len(pairs) == 6 and all(a != b for a, b in pairs)
    assert all(abs(c / 12_000 - 1 / 6) < 0.02 for c in pairs.values()), pairs
