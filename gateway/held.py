"""Metric changes held until the end of the event loop's turn (gateway.metrics' series).

prometheus_client takes a lock per value and walks a histogram's buckets in Python per
observation, which was a tenth of a whole answer's CPU: `child` gives a series' holder,
which keeps this turn's changes, and `flush` (scheduled at the first change of a turn; a
scrape and the shutdown call it too) hands each series' turn over at once. With several
serving processes (prometheus_client's multiprocess mode) it writes them to the process's
metrics file itself (`_filed`).
"""

from __future__ import annotations

import asyncio
import bisect
import os
import struct
from typing import Any

import prometheus_client as prom

try:  # prometheus_client's one-process value; another release may lack it: its own `inc` then
    from prometheus_client.values import MutexValue
except ImportError:  # pragma: no cover - depends on the installed prometheus_client
    MutexValue = None  # type: ignore[assignment,misc]

_children: dict[tuple[object, tuple[str, ...]], Any] = {}
_dirty: list[Any] = []  # series changed in this turn of the event loop


def child(metric: Any, *labels: str) -> Any:
    """`metric.labels(*labels)`, remembered (the label sets are bounded, and labels() checks
    and converts its arguments on every call), behind a holder that keeps this turn's changes
    until `flush`."""
    key = (metric, labels)
    found = _children.get(key)
    if found is None:
        series = metric.labels(*labels)
        if isinstance(metric, prom.Histogram):
            found = _Buckets(series) if _Buckets.fits(series) else _Observations(series)
        else:
            found = _Delta(series)
        _children[key] = found
    return found


def flush() -> None:
    """Hand what this turn recorded to prometheus_client (scheduled at the first change of
    a turn; a scrape and the shutdown call it too)."""
    dirty = _dirty[:]
    _dirty.clear()
    for series in dirty:
        series.flush()


def _changed(series: Any) -> None:
    _dirty.append(series)
    if len(_dirty) == 1:
        try:
            asyncio.get_running_loop().call_soon(flush)
        except RuntimeError:  # no loop running: at once
            flush()


def _mutex(value: Any) -> MutexValue | None:
    """`value` where prometheus_client keeps it as a plain float behind a lock (one serving
    process), which `flush` then adds to itself: the event loop's thread is its only writer
    (a scrape reads it under the lock), and `inc` took the lock and, for a counter, checked
    the amount, per series per turn, two to five Python calls each. None otherwise (the
    multiprocess mode's files): its own `inc`."""
    return value if MutexValue is not None and type(value) is MutexValue \
        and isinstance(getattr(value, "_value", None), float) else None


_TWO_DOUBLES = struct.Struct("dd").pack_into  # a multiprocess file's value and timestamp
_files_ours = True  # False in a child forked from this process: prometheus_client's `inc`


def _forked() -> None:
    global _files_ours
    _files_ours = False  # its `inc` finds the new pid and reopens its files; leave it to it


os.register_at_fork(after_in_child=_forked)


def _filed(value: Any) -> Any | None:
    """`value` where prometheus_client's multiprocess mode (`server.workers` > 1) keeps it: a
    float mirrored in this process's mmap file (`MmapedValue`: `_value`, `_key`, and `_file`,
    a `MmapedDict` whose `_positions` hold the key's offset in its map `_m`), which `flush`
    then writes as `inc` does, by `_file_add`. `inc` takes a lock and asks for the pid (a
    system call) per value, about a microsecond each, ten values a whole answer: 15 % more
    instructions with several serving processes than with one. None otherwise: its own
    `inc`."""
    f = getattr(value, "_file", None)
    positions = getattr(f, "_positions", None)
    return value if getattr(value, "_multiprocess", False) and isinstance(positions, dict) \
        and getattr(value, "_key", None) in positions and hasattr(f, "_m") \
        and isinstance(getattr(value, "_value", None), float) else None


def _file_add(value: Any, amount: float) -> None:
    """`MmapedValue.inc(amount)` of a value `_filed` took: the sum, then its 16 bytes (the
    value and a 0.0 timestamp) written where `MmapedDict.write_value` writes them, by one
    `pack_into` as it does. Its lock is for threads, and the event loop's is the only
    one writing metrics; the file's map is read each time (adding a key may remap it), the
    key's offset never moves."""
    value._value += amount  # noqa: SLF001 - see _filed
    value._timestamp = 0.0  # noqa: SLF001
    f = value._file  # noqa: SLF001
    _TWO_DOUBLES(f._m, f._positions[value._key], value._value, 0.0)  # noqa: SLF001


class _Held:
    """A series' holder: `add` keeps a change for this turn; `observe` (a counter's or
    gauge's `inc`) does that and marks the holder changed, once per turn."""

    __slots__ = ()
    dirty: bool

    def add(self, amount: float) -> None:
        raise NotImplementedError

    def observe(self, amount: float = 1.0) -> None:
        was = self.dirty
        self.add(amount)
        if not was:  # after the change: with no loop running, `_changed` flushes at once
            _changed(self)

    def inc(self, amount: float = 1.0) -> None:  # a counter's or gauge's name for it
        self.observe(amount)


class _Delta(_Held):
    """A counter's or gauge's series; its change in this turn, applied at `flush`."""

    __slots__ = ("delta", "dirty", "filed", "series", "value")

    def __init__(self, series: Any):
        self.series = series
        self.value = _mutex(getattr(series, "_value", None))
        self.filed = _filed(getattr(series, "_value", None))
        self.delta = 0.0
        self.dirty = False

    def dec(self, amount: float = 1.0) -> None:  # gauges only
        self.inc(-amount)

    def add(self, amount: float) -> None:
        """As `inc`, for a `Routed` member: its group is marked changed instead."""
        self.delta += amount
        self.dirty = True

    def flush(self) -> None:
        delta, self.delta, self.dirty = self.delta, 0.0, False
        if delta:  # a gauge's may be negative; a counter's never is
            if self.value is not None:
                self.value._value += delta  # noqa: SLF001 - see _mutex
            elif self.filed is not None and _files_ours:
                _file_add(self.filed, delta)
            else:
                self.series.inc(delta)


class _Buckets(_Held):
    """A histogram's series; this turn's observations counted per bucket, added at `flush`
    (prometheus_client keeps a count per bucket, not cumulative, and the sum)."""

    __slots__ = ("bounds", "counts", "dirty", "direct", "filed", "series", "total")

    def __init__(self, series: Any):
        self.series = series
        self.bounds = list(series._upper_bounds)  # noqa: SLF001 - ends with +Inf
        # each bucket's and the sum's float added to directly where it is one (_mutex), or
        # written to its multiprocess file directly (_filed)
        self.direct = _mutex(series._sum) is not None and all(  # noqa: SLF001
            _mutex(b) is not None for b in series._buckets)  # noqa: SLF001
        self.filed = _filed(series._sum) is not None and all(  # noqa: SLF001
            _filed(b) is not None for b in series._buckets)  # noqa: SLF001
        self.counts: dict[int, int] = {}
        self.total = 0.0
        self.dirty = False

    @staticmethod
    def fits(series: Any) -> bool:
        """Whether this prometheus_client keeps histograms as this expects."""
        return all(hasattr(series, name) for name in ("_upper_bounds", "_buckets", "_sum"))

    def add(self, amount: float) -> None:
        """As `observe`, for a `Routed` member: its group is marked changed instead."""
        i = bisect.bisect_left(self.bounds, amount)  # the first bound >= amount, as observe()
        counts = self.counts
        counts[i] = counts[i] + 1 if i in counts else 1
        self.total += amount
        self.dirty = True

    def flush(self) -> None:
        buckets = self.series._buckets  # noqa: SLF001
        if self.direct:
            for i, n in self.counts.items():
                buckets[i]._value += n  # noqa: SLF001
            self.series._sum._value += self.total  # noqa: SLF001
        elif self.filed and _files_ours:
            for i, n in self.counts.items():
                _file_add(buckets[i], n)
            _file_add(self.series._sum, self.total)  # noqa: SLF001
        else:
            for i, n in self.counts.items():
                buckets[i].inc(n)
            self.series._sum.inc(self.total)  # noqa: SLF001
        self.counts.clear()
        self.total = 0.0
        self.dirty = False


class _Observations(_Held):
    """A histogram's series where prometheus_client is not as `_Buckets` expects: the
    observations themselves, handed over at `flush`."""

    __slots__ = ("dirty", "series", "values")

    def __init__(self, series: Any):
        self.series = series
        self.values: list[float] = []
        self.dirty = False

    def add(self, amount: float) -> None:
        """As `observe`, for a `Routed` member: its group is marked changed instead."""
        self.values.append(amount)
        self.dirty = True

    def flush(self) -> None:
        for amount in self.values:
            self.series.observe(amount)
        self.values.clear()
        self.dirty = False
