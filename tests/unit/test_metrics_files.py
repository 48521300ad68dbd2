"""With several serving processes (prometheus_client's multiprocess mode) a turn's held
metric changes are written to the process's mmap file by `gateway.held` itself, not by
prometheus_client's `inc` (its lock and a pid system call per value). The file must then hold
exactly what `inc` and `observe` would have written: every key, value and timestamp, over
several turns, for counters, live gauges and histograms; and a forked child must leave the
writing to prometheus_client (which reopens its files for the new pid)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import prometheus_client as prom
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import values
from prometheus_client.mmap_dict import MmapedDict

from gateway import held, metrics

BUCKETS = (0.01, 0.1, 1.0, 10.0)


@contextmanager
def multiprocess_values(directory: str) -> Iterator[None]:
    """prometheus_client's multiprocess value class, writing to `directory`, for the metrics
    made inside (it picks its class when a series is made, and its file when the first value
    of a kind is made)."""
    saved, env = values.ValueClass, os.environ.get(metrics.MULTIPROC_ENV)
    os.environ[metrics.MULTIPROC_ENV] = directory
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        values.ValueClass = saved
        if env is None:
            del os.environ[metrics.MULTIPROC_ENV]
        else:
            os.environ[metrics.MULTIPROC_ENV] = env


def series(directory: str) -> tuple[Any, Any, Any]:
    with multiprocess_values(directory):
        counter = prom.Counter("c", "", ["k"], registry=None).labels("a")
        gauge = prom.Gauge("g", "", ["k"], registry=None, multiprocess_mode="livesum").labels("a")
        histogram = prom.Histogram("h", "", ["k"], buckets=BUCKETS, registry=None).labels("a")
    return counter, gauge, histogram


def files(directory: str) -> dict[str, dict[str, tuple[float, float]]]:
    return {name: {key: (value, stamp) for key, value, stamp, _ in
                   MmapedDict.read_all_values_from_file(os.path.join(directory, name))}
            for name in sorted(os.listdir(directory))}


def holder_of(series: Any) -> Any:
    """What `held.child` puts behind a series (without its cache of every series made)."""
    return held._Buckets(series) if isinstance(series, prom.Histogram) \
        else held._Delta(series)  # noqa: SLF001


Turns = list[list[tuple[str, float]]]
TURNS = st.lists(st.lists(st.tuples(st.sampled_from(["c", "g", "h"]),
                                    st.floats(0, 20, allow_nan=False)), max_size=8), max_size=5)


def apply(turns: Turns, ours: str, theirs: str) -> None:
    held_counter, held_gauge, held_histogram = series(ours)
    holders = {"c": holder_of(held_counter), "g": holder_of(held_gauge),
               "h": holder_of(held_histogram)}
    assert holders["c"].filed is not None and holders["g"].filed is not None
    assert holders["h"].filed
    counter, gauge, histogram = series(theirs)
    for turn in turns:
        for kind, amount in turn:
            holders[kind].add(amount if kind != "g" else amount - 10)  # a gauge goes down too
            if kind == "c":
                counter.inc(amount)
            elif kind == "g":
                gauge.inc(amount - 10)
            else:
                histogram.observe(amount)
        for holder in holders.values():
            if holder.dirty:
                holder.flush()


@settings(max_examples=40, deadline=None)
@given(TURNS)
def test_held_changes_reach_the_file_as_prometheus_client_writes_them(turns: Turns) -> None:
    with tempfile.TemporaryDirectory() as ours, tempfile.TemporaryDirectory() as theirs:
        apply(turns, ours, theirs)
        mine, its = files(ours), files(theirs)
        assert set(mine) == {f"counter_{os.getpid()}.db", f"gauge_livesum_{os.getpid()}.db",
                             f"histogram_{os.getpid()}.db"}
        assert mine.keys() == its.keys()
        for name in mine:
            assert mine[name].keys() == its[name].keys()
            for key, (value, stamp) in mine[name].items():
                assert value == pytest.approx(its[name][key][0]) and stamp == its[name][key][1]


def test_a_forked_child_leaves_the_files_to_prometheus_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory() as directory:
        counter, _, histogram = series(directory)
        delta, buckets = holder_of(counter), holder_of(histogram)
        calls: list[str] = []
        monkeypatch.setattr(held, "_file_add", lambda *a: calls.append("ours"))
        monkeypatch.setattr(held, "_files_ours", False)  # what os.register_at_fork sets
        delta.add(2.0)
        delta.flush()
        buckets.add(0.5)
        buckets.flush()
        assert calls == []
        assert counter._value.get() == 2.0  # noqa: SLF001 - prometheus_client's own inc
        assert [b.get() for b in histogram._buckets] == [0.0, 0.0, 1.0, 0.0, 0.0]  # noqa: SLF001


def test_one_process_values_are_not_taken_for_files() -> None:
    counter = prom.Counter("one", "", ["k"], registry=None).labels("a")
    assert held._filed(counter._value) is None  # noqa: SLF001
    assert holder_of(counter).filed is None
