"""Prefix routing: consistent hashing with bounded loads (Mirrokni et al. 2016)."""

from __future__ import annotations

import collections
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import affinity, balancer
from schemas import canonical

URLS = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 5))


@settings(max_examples=200, deadline=None)
@given(loads=st.lists(st.integers(0, 50), min_size=4, max_size=4), key=st.text(max_size=40),
       eps=st.sampled_from([0.1, 0.25, 1.0]))
def test_the_chosen_worker_stays_within_the_bound(loads: list[int], key: str,
                                                   eps: float) -> None:
    load = dict(zip(URLS, loads, strict=True))
    order = affinity.Ring(URLS).walk(key, list(URLS), load.__getitem__, eps)
    cap = math.ceil((1 + eps) * (sum(loads) + 1) / len(URLS))
    assert sorted(order) == sorted(URLS)
    assert load[order[0]] + 1 <= cap


def test_same_prefix_same_worker_and_load_spills_in_ring_order() -> None:
    ups = balancer.Upstreams(URLS, "prefix")
    first = ups.order("system: you are helpful")[0]
    assert all(ups.order("system: you are helpful")[0] == first for _ in range(10))
    # a hot prefix: requests stay in flight, so the bound moves later ones along the ring
    chosen = []
    for _ in range(40):
        u = ups.order("system: you are helpful")[0]
        ups.begin(u)
        chosen.append(u)
    counts = collections.Counter(chosen)
    assert counts[first] == max(counts.values())
    assert max(counts.values()) <= math.ceil(1.25 * 40 / 4) + 1


def test_many_prefixes_spread_over_every_worker() -> None:
    ring = affinity.Ring(URLS)
    counts = collections.Counter(
        ring.walk(f"conversation {i}", list(URLS), lambda _: 0.0, 0.25)[0] for i in range(2000))
    assert set(counts) == set(URLS)
    assert min(counts.values()) > 2000 / 4 * 0.6  # virtual nodes keep the arcs even


def test_ejected_worker_is_skipped_for_the_next_on_the_ring() -> None:
    ups = balancer.Upstreams(URLS, "prefix")
    key = "system: translate"
    first, second = ups.order(key)[:2]
    for _ in range(3):
        ups.failed(first)
    assert ups.order(key)[0] == second


def test_prefix_key_is_the_leading_text_of_the_rendered_prompt() -> None:
    system = "s" * 2000
    a = canonical.InferenceRequest(messages=[canonical.Message("system", system),
                                             canonical.Message("user", "one")])
    b = canonical.InferenceRequest(messages=[canonical.Message("system", system),
                                             canonical.Message("user", "two")])
    assert affinity.prefix_key(a) == affinity.prefix_key(b)
    assert len(affinity.prefix_key(a)) == affinity.PREFIX_CHARS
    c = canonical.InferenceRequest(prompts=["hello world"])
    assert affinity.prefix_key(c) == "hello world"
