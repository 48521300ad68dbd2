"""Metric changes held until the end of the event loop's turn (gateway.metrics' series).

prometheus_client takes a lock per value and walks a histogram's buckets in Python per
observation, which was a tenth of a whole answer's CPU: `child` gives a series' holder,
which keeps this turn's changes, and `flush` (scheduled at the first change of a turn; a
scrape and the shutdown call it too) hands each series' turn over at once.
"""

from __future__ import annotations

import asyncio
import bisect
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

    inc = observe


class _Delta(_Held):
    """A counter's or gauge's series; its change in this turn, applied at `flush`."""

    __slots__ = ("delta", "dirty", "series", "value")

    def __init__(self, series: Any):
        self.series = series
        self.value = _mutex(getattr(series, "_value", None))
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
            else:
                self.series.inc(delta)


class _Buckets(_Held):
    """A histogram's series; this turn's observations counted per bucket, added at `flush`
    (prometheus_client keeps a count per bucket, not cumulative, and the sum)."""

    __slots__ = ("bounds", "counts", "dirty", "direct", "series", "total")

    def __init__(self, series: Any):
        self.series = series
        self.bounds = list(series._upper_bounds)  # noqa: SLF001 - ends with +Inf
        # each bucket's and the sum's float added to directly where it is one (_mutex)
        self.direct = _mutex(series._sum) is not None and all(  # noqa: SLF001
            _mutex(b) is not None for b in series._buckets)  # noqa: SLF001
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
