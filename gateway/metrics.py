"""Every Prometheus metric of the gateway, defined here and only here (so that a switch to
prometheus_client's multiprocess mode touches one module).

Names follow the OpenTelemetry GenAI semantic conventions (semantic-conventions
docs/gen-ai/gen-ai-metrics.md) in the form OpenTelemetry's Prometheus exporter gives them:
dots become underscores and the unit `s` becomes a `_seconds` suffix; each histogram uses the
spec's advised ExplicitBucketBoundaries. The gateway's own metrics are `gateway_*`.

Labels are bounded by the configuration, never by what a client sends: models are configured
names (anything else is `unknown`), routes are templates (`/predictions/{model}`), status is a
class (`4xx`), errors are exception class names. Everything is recorded once per request or per
upstream attempt, never per streamed chunk, and held until the end of the event loop's turn
(`child`, `flush`): prometheus_client takes a lock per value and walks a histogram's buckets in
Python per observation, which was a tenth of a whole answer's CPU; a turn's requests now cost
it one update per series. An upstream no longer listed (a pod gone from DNS) loses its series
at the next scrape (`refresh_upstreams`, `_ListedOnly`).

With several serving processes (`server.workers: N`) prometheus_client's multiprocess mode
sums every process's samples (`collected`): the in-flight gauge is `livesum` (a process that
ended leaves the sum, `process_gone`), upstream health the latest of live processes (each
scrape sets it from a view gateway.board keeps shared); the process metrics (CPU, memory,
open files) are the parent's and its live serving processes' summed (`_GatewayProcesses`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import prometheus_client as prom
from prometheus_client import multiprocess

from gateway import held
from gateway import upstream as upstream_url

if TYPE_CHECKING:
    from gateway.routing import Router

REGISTRY = prom.CollectorRegistry(auto_describe=True)
prom.ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, resident memory, fds
prom.PlatformCollector(registry=REGISTRY)  # python_info
prom.GCCollector(registry=REGISTRY)  # python_gc_*

UNKNOWN_MODEL = "unknown"

# ExplicitBucketBoundaries advised by the GenAI semantic conventions, per metric.
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92)  # gen_ai.server.request.duration, gen_ai.client.operation.duration
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0)  # gen_ai.server.time_to_first_token
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                2.5)  # gen_ai.server.time_per_output_token
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)  # gen_ai.client.token.usage

OPERATION, MODEL, PROVIDER = "gen_ai_operation_name", "gen_ai_request_model", "gen_ai_provider_name"
GENAI = (OPERATION, MODEL, PROVIDER)

REQUEST_DURATION = prom.Histogram(
    "gen_ai_server_request_duration_seconds",
    "From a request's arrival to its answer's last byte (gen_ai.server.request.duration)",
    [*GENAI, "http_route", "http_status_class", "error_type"],
    buckets=DURATION_BUCKETS, registry=REGISTRY)
TIME_TO_FIRST_TOKEN = prom.Histogram(
    "gen_ai_server_time_to_first_token_seconds",
    "From a streamed request's arrival to the worker's first event; successful streams only",
    GENAI, buckets=TTFT_BUCKETS, registry=REGISTRY)
TIME_PER_OUTPUT_TOKEN = prom.Histogram(
    "gen_ai_server_time_per_output_token_seconds",
    "A successful stream's time after its first token, per further output token",
    GENAI, buckets=TPOT_BUCKETS, registry=REGISTRY)
TOKEN_USAGE = prom.Histogram(
    "gen_ai_client_token_usage", "Tokens per request, by gen_ai_token_type input or output",
    [*GENAI, "gen_ai_token_type"], buckets=TOKEN_BUCKETS, registry=REGISTRY)
OPERATION_DURATION = prom.Histogram(
    "gen_ai_client_operation_duration_seconds",
    "One attempt upstream, from sending to its answer's end or failure",
    [*GENAI, "server_address", "server_port", "error_type"],
    buckets=DURATION_BUCKETS, registry=REGISTRY)

# Requests and errors as counters too (SPEC.md: "Prometheus counters ... (requests, errors"),
# for the `rate(..._total)` queries and alerts operators write first; the duration
# histogram's `_count` holds the same numbers by more labels.
REQUESTS = prom.Counter("gateway_requests", "Requests answered, by model, route and status class",
                        [MODEL, "http_route", "http_status_class"], registry=REGISTRY)
ERRORS = prom.Counter("gateway_request_errors",
                      "Requests that ended in an error (a refusal, a failure upstream, a client "
                      "gone), by the error's type", [MODEL, "http_route", "error_type"],
                      registry=REGISTRY)
IN_FLIGHT = prom.Gauge("gateway_requests_in_flight",
                       "Requests routed to a model and not yet answered in full", [MODEL],
                       registry=REGISTRY, multiprocess_mode="livesum")
ATTEMPTS = prom.Counter("gateway_upstream_attempts", "Requests sent to an upstream",
                        [MODEL, "upstream", "error_type"], registry=REGISTRY)
RETRIES = prom.Counter("gateway_upstream_retries",
                       "Attempts after a failed one before the first byte, by the upstream tried",
                       [MODEL, "upstream"], registry=REGISTRY)
FAILOVERS = prom.Counter("gateway_upstream_failovers",
                         "Streams continued on this upstream after another failed mid-stream",
                         [MODEL, "upstream"], registry=REGISTRY)
EJECTIONS = prom.Counter("gateway_upstream_ejections",
                         "Times an upstream was taken out of rotation for failing",
                         [MODEL, "upstream"], registry=REGISTRY)
# Every scrape sets each series from the scraping process's view, which gateway.board keeps
# the same in every process: with several processes the latest value is the one to show (of
# live processes: one that ended leaves none behind).
UPSTREAM_HEALTHY = prom.Gauge("gateway_upstream_healthy",
                              "1 while an upstream is in rotation, 0 while ejected",
                              [MODEL, "upstream"], registry=REGISTRY,
                              multiprocess_mode="livemostrecent")

# Upstream labels as logs show them too: a password in a URL's userinfo masked (/metrics is
# open even when API keys are set).
shown = upstream_url.shown
_listed: set[tuple[str, str]] = set()
# The holders that keep a turn's changes (gateway.held), as this module's own.
child, flush, _changed = held.child, held.flush, held._changed  # noqa: SLF001
_children, _dirty = held._children, held._dirty  # noqa: SLF001
_Delta, _Buckets, _Observations = held._Delta, held._Buckets, held._Observations  # noqa: SLF001


class Routed:
    """The series a routed request records in the common case (a 2xx with no error, its
    upstream attempts ending well), for one (http route, operation, model, provider): found
    once per request (`routed`) instead of by `child` per observation, and marked changed
    once per turn for all of them (`touch`) instead of once per series."""

    __slots__ = ("_base", "_members", "_upstreams", "dirty", "duration", "genai", "in_flight",
                 "requests", "route", "tokens_in", "tokens_out", "tpot", "ttft")

    def __init__(self, route: str, operation: str, model: str, provider: str):
        genai = self.genai = (operation, model, provider)
        self.route = route
        self.in_flight = child(IN_FLIGHT, model)
        self.duration = child(REQUEST_DURATION, *genai, route, "2xx", "")
        self.requests = child(REQUESTS, model, route, "2xx")
        self.tokens_in = child(TOKEN_USAGE, *genai, "input")
        self.tokens_out = child(TOKEN_USAGE, *genai, "output")
        self.ttft = child(TIME_TO_FIRST_TOKEN, *genai)
        self.tpot = child(TIME_PER_OUTPUT_TOKEN, *genai)
        self._base = [self.in_flight, self.duration, self.requests, self.tokens_in,
                      self.tokens_out, self.ttft, self.tpot]
        self._members = list(self._base)
        # upstream URL -> its (attempts, attempt duration) series of an attempt with no error
        self._upstreams: dict[str, tuple[Any, Any]] = {}
        self.dirty = False

    def upstream(self, url: str) -> tuple[Any, Any]:
        """`url`'s attempt counter and attempt duration, for an attempt with no error."""
        found = self._upstreams.get(url)
        if found is None:
            operation, model, provider = self.genai
            host, port = address(url)
            found = self._upstreams[url] = (
                child(ATTEMPTS, model, shown(url), ""),
                child(OPERATION_DURATION, operation, model, provider, host, str(port), ""))
            self._members += found
        return found

    def forget_upstreams(self) -> None:
        """Upstream series are looked up again (some were dropped: `_forget`)."""
        self._upstreams.clear()
        self._members = list(self._base)

    def touch(self) -> None:
        """Something was added to a member (by its `add`, which marks the member dirty but
        leaves it to its group to be flushed): flushed at the turn's end."""
        if not self.dirty:
            self.dirty = True
            _changed(self)

    def flush(self) -> None:
        self.dirty = False
        for member in self._members:
            if member.dirty:  # a member's own flush clears it (a shared one: flushed once)
                member.flush()


_routed: dict[tuple[str, str, str, str], Routed] = {}


def routed(route: str, operation: str, model: str, provider: str) -> Routed:
    """The `Routed` series of these labels, made on first use (the label sets are bounded
    by the configuration)."""
    key = (route, operation, model, provider)
    found = _routed.get(key)
    if found is None:
        found = _routed[key] = Routed(route, operation, model, provider)
    return found




@functools.lru_cache(maxsize=4096)
def address(url: str) -> tuple[str, int]:
    """`server.address` and `server.port` of an upstream base URL."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "none"


def attempt(model: str, upstream: str, error_type: str = "") -> None:
    child(ATTEMPTS, model, shown(upstream), error_type).inc()


def retry(model: str, upstream: str) -> None:
    """An attempt on `upstream` after an earlier attempt of the same request failed."""
    child(RETRIES, model, shown(upstream)).inc()


def failover(model: str, upstream: str) -> None:
    """A stream that broke mid-way is continued on `upstream` (routing calls this)."""
    child(FAILOVERS, model, shown(upstream)).inc()


def ejected(model: str, upstream: str) -> None:
    """`upstream` leaves the rotation after failures (routing calls this)."""
    EJECTIONS.labels(model, shown(upstream)).inc()
    UPSTREAM_HEALTHY.labels(model, shown(upstream)).set(0)


def restored(model: str, upstream: str) -> None:
    """An ejected `upstream` is back in rotation (routing calls this)."""
    UPSTREAM_HEALTHY.labels(model, shown(upstream)).set(1)


def declare(router: Router) -> None:
    """Series that exist from startup at zero, so dashboards and alerts see them before the
    first request (Prometheus' advice for known label values). A new router has ejected
    nothing yet."""
    for route in router.routes.values():
        IN_FLIGHT.labels(route.name)
        for url in route.upstreams.all:
            for counter in (RETRIES, FAILOVERS, EJECTIONS):
                counter.labels(route.name, shown(url))
    refresh_upstreams(router)


def refresh_upstreams(router: Router) -> None:
    """Health of every listed upstream; upstreams no longer listed (a worker pod gone from
    DNS, a stopped managed worker) lose their series, so churn does not pile them up."""
    flush()  # before any series is dropped
    listed = {(r.name, shown(url)) for r in router.routes.values() for url in r.upstreams.all}
    serving = {(r.name, shown(url)) for r in router.routes.values()
               for url in r.upstreams.in_service()}
    for key in listed - _listed:  # managed workers and DNS-found pods from their listing on
        for counter in (RETRIES, FAILOVERS, EJECTIONS):
            counter.labels(*key)
    gone = _listed - listed
    for key in gone:
        UPSTREAM_HEALTHY.remove(*key)
    if gone:
        _forget(gone, listed)
    _listed.clear()
    _listed.update(listed)
    for key in listed:
        UPSTREAM_HEALTHY.labels(*key).set(1 if key in serving else 0)


# Families with an upstream's series: by (model, upstream URL), or by (model, host, port).
_BY_URL = (ATTEMPTS, RETRIES, FAILOVERS, EJECTIONS, UPSTREAM_HEALTHY)
_BY_ADDRESS = (OPERATION_DURATION,)


def _addresses(listed: set[tuple[str, str]]) -> set[tuple[str, str, str]]:
    """(model, host, port) of each (model, URL), as OPERATION_DURATION labels them."""
    out = set()
    for model, url in listed:
        host, port = address(url)
        out.add((model, host, str(port)))
    return out


def _forget(gone: set[tuple[str, str]], listed: set[tuple[str, str]]) -> None:
    """Drop this process's series of upstreams no longer listed: a pod's counters would
    otherwise stay in memory and in every scrape after it is gone. An address another
    listed URL of the model still has keeps its series."""
    gone_addresses = _addresses(gone) - _addresses(listed)

    def stale(metric: Any, labels: Sequence[str]) -> bool:
        if metric in _BY_URL:
            return (labels[0], labels[1]) in gone
        return metric in _BY_ADDRESS and (labels[1], labels[3], labels[4]) in gone_addresses

    for key in [k for k in _children if stale(*k)]:
        del _children[key]
    for group in _routed.values():
        group.forget_upstreams()
    for metric in (*_BY_URL, *_BY_ADDRESS):
        # prometheus_client lists a metric's label sets only in its private `_metrics`
        for values in [v for v in metric._metrics if stale(metric, v)]:  # noqa: SLF001
            metric.remove(*values)


class _ListedOnly:
    """The exposition less the series of upstreams not listed now. With several serving
    processes the samples come from prometheus_client's files, where a removed series stays
    (its files cannot drop a key); this keeps them out of the scrape all the same."""

    def __init__(self, source: prom.CollectorRegistry, listed: set[tuple[str, str]]):
        self.source = source
        self.listed = listed
        self.addresses = _addresses(listed)
        self.by_url = {m._name for m in _BY_URL}  # noqa: SLF001
        self.by_address = {m._name for m in _BY_ADDRESS}  # noqa: SLF001

    def collect(self) -> Iterator[Any]:
        for family in self.source.collect():
            if family.name in self.by_url:
                family.samples = [s for s in family.samples if
                                  (s.labels.get(MODEL), s.labels.get("upstream")) in self.listed]
            elif family.name in self.by_address:
                family.samples = [s for s in family.samples if (
                    s.labels.get(MODEL), s.labels.get("server_address"),
                    s.labels.get("server_port")) in self.addresses]
            yield family


def exposition(router: Router) -> bytes:
    refresh_upstreams(router)
    shown = prom.CollectorRegistry(auto_describe=False)
    shown.register(_ListedOnly(collected(), set(_listed)))
    return bytes(prom.generate_latest(shown))


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def collected() -> prom.CollectorRegistry:
    """This process's registry; with several serving processes (`server.workers`), every
    process's samples summed from the directory that prometheus_client's multiprocess mode
    writes (the parent sets PROMETHEUS_MULTIPROC_DIR before they start; the process
    collectors above are then left out, being per process)."""
    path = os.environ.get(MULTIPROC_ENV)
    if not path:
        return REGISTRY
    merged = prom.CollectorRegistry()
    multiprocess.MultiProcessCollector(merged, path)  # type: ignore[no-untyped-call]
    merged.register(_GatewayProcesses(path))
    prom.PlatformCollector(registry=merged)  # python_info: the same in every process
    return merged


class _GatewayProcesses:
    """prometheus_client's process metrics summed over the gateway's own processes: the
    parent and each live serving process (those writing multiprocess files to `path`, the
    parent's children), not the managed workers. CPU seconds, memory and open files add up;
    the start time is the earliest (the gateway's), the open-files limit the highest."""

    def __init__(self, path: str):
        self.path = path

    def pids(self) -> list[int]:
        parent = os.getppid()
        named = {pid for stem, _, pid in (n.removesuffix(".db").rpartition("_")
                                          for n in os.listdir(self.path))
                 if stem and pid.isdigit()}  # files `{kind}_{pid}.db`, some of gone ones
        return sorted({parent, os.getpid()} | {
            int(pid) for pid in named if _parent_of(int(pid)) == parent})

    def collect(self) -> Iterator[Any]:
        families: dict[str, Any] = {}
        for pid in self.pids():
            reader = prom.ProcessCollector(pid=functools.partial(int, pid), registry=None)
            for fam in reader.collect():
                if fam.name not in families:
                    families[fam.name] = fam
                    continue
                mine = families[fam.name].samples
                pick = min if fam.name == "process_start_time_seconds" else \
                    max if fam.name == "process_max_fds" else sum
                mine[:] = [a._replace(value=pick((a.value, b.value)))
                           for a, b in zip(mine, fam.samples, strict=True)]
        yield from families.values()


def _parent_of(pid: int) -> int | None:
    """The parent's pid of a live process, from /proc; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def process_gone(pid: int) -> None:
    """A serving process ended: its `live*` gauges leave the sums (multiprocess mode)."""
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


CONTENT_TYPE = prom.CONTENT_TYPE_LATEST
