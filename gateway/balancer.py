"""A model's upstream set: which workers are in rotation now, and which one a request tries first.

A configured `http://` upstream whose host is a DNS name (a Kubernetes headless Service, say)
stands for every address the name resolves to; `gateway.resolver` refreshes that expansion,
so scaling workers needs no gateway restart. Managed workers are added once healthy.

Health, as Envoy's outlier detection does it: an upstream failing `eject_after` times in a
row is ejected for a backoff; once that is over it is half-open: it counts for /health again
and gets one request, the trial, whose success or a passing active probe restores it, while
its failure or a failing probe ejects it again for twice as long. Each attempt carries a ticket
from `begin`, so that attempts already in flight when the upstream was ejected (or restored)
are not judged again: a burst of failures is one ejection, as Envoy never ejects an ejected
host. A failure of an ejected upstream outside its trial counts for nothing. Static upstreams
are pending until their first probe, which runs at once: routed to, but not yet counted for
/health (Envoy's PENDING_ACTIVE_HC). An ejected
upstream is not offered at all, so it costs requests nothing, unless every upstream of the
model is ejected: then all those whose probe passes are tried anyway (Envoy's panic mode),
since refusing without trying helps no one.

Choice (`models[].routing`): `least_request` is power of two choices (Mitzenmacher) on the
gateway's in-flight count plus the worker's published queue; `round_robin`; `prefix` is
consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2016) on the prompt's
opening (`affinity.prefix_key`), so turns of a conversation and users of a system prompt meet
the same KV cache.
"""

from __future__ import annotations

import ipaddress
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol
from urllib.parse import urlsplit

from mypy_extensions import mypyc_attr

from gateway import affinity, board, config

Policy = Literal["least_request", "round_robin", "prefix"]
SORT_ABOVE: Final = 16  # least_request's rest by `sorted` above this many, else natively


def dns_name(url: str) -> str | None:
    """The host of an http:// URL when it is a name to resolve (not an IP literal)."""
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme != "http" or not host:
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host
    return None


class Listener(Protocol):
    """Told when an upstream leaves or rejoins rotation (gateway.hooks: logs and metrics)."""

    def ejected(self, model: str, url: str, backoff: float) -> None: ...

    def restored(self, model: str, url: str) -> None: ...

    def probe_changed(self, model: str, url: str, ok: bool, why: str = "") -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)
class Quiet:
    """A listener that does nothing (unit tests, tools)."""

    def ejected(self, model: str, url: str, backoff: float) -> None:
        return None

    def restored(self, model: str, url: str) -> None:
        return None

    def probe_changed(self, model: str, url: str, ok: bool, why: str = "") -> None:
        return None


@dataclass(slots=True)
class Health:
    """One upstream's standing: passive failures, ejection, probe result, load."""

    failures: int = 0  # consecutive
    ejected_until: float = 0.0  # 0: in rotation; else ejected (half-open once it has passed)
    backoff: float = 0.0  # length of the last ejection; 0 again once a request succeeds
    trial: bool = False  # the one half-open request is out
    since: int = 0  # ticket at the last change of standing: verdicts on older attempts are stale
    probe_ok: bool | None = True  # None: not probed yet (a static upstream at startup)
    in_flight: int = 0
    queued: float = 0.0  # the worker's own waiting queue, from its /metrics
    shared: board.Standing | None = None  # the last standing shared (gateway.board)
    born: int = 0  # ticket when this standing began: attempts older than it ended elsewhere

    def available(self, now: float) -> bool:
        if self.probe_ok is False:
            return False
        return self.ejected_until == 0.0 or (self.ejected_until <= now and not self.trial)

    def counted(self, now: float) -> bool:
        """Probed and passing, and in rotation or half-open: what /health counts."""
        return self.probe_ok is True and self.ejected_until <= now

    def standing(self, wall: float, now: float) -> board.Standing:
        """This standing for the other serving processes, its times on the wall clock."""
        until = wall + max(0.0, self.ejected_until - now) if self.ejected_until else 0.0
        return board.Standing(wall, until, self.backoff, self.probe_ok)


@mypyc_attr(allow_interpreted_subclasses=True)  # tests replace its load reading
class Upstreams:
    """Static upstreams from the config (DNS-expanded) plus managed workers, with health."""

    def __init__(self, static: tuple[str, ...] = (), policy: Policy = "round_robin",
                 health: config.HealthConfig | None = None,
                 clock: affinity.Clock = time.monotonic, model: str = "",
                 listener: Listener | None = None):
        self._static = list(static)
        self._resolved: dict[str, list[str]] = {}
        self._managed: list[str] = []
        self._counter = itertools.count()
        self._tickets = itertools.count(1)
        self._all: list[str] = []
        self._static_all: list[str] = []
        # an address a DNS name was expanded to -> that name's authority (`name:port`): the
        # Host its requests name (gateway.resolver)
        self.hosts: dict[str, str] = {}
        self.policy = policy
        self.settings = health or config.HealthConfig()
        self.health: dict[str, Health] = {}
        self.ring = affinity.Ring()
        self.clock = clock
        self.model = model  # for the events it reports
        self.listener: Listener = listener or Quiet()
        self.on_pending: Callable[[], None] = lambda: None  # a static upstream awaits its probe
        self.board: board.Board | None = None  # shared with the other serving processes
        self.wall: affinity.Clock = time.time
        self._rebuild()

    @property
    def all(self) -> list[str]:
        return self._all

    @property
    def static(self) -> list[str]:
        """Configured upstreams as expanded now: the ones the gateway probes itself (managed
        workers are probed by their supervisor)."""
        return self._static_all

    @property
    def to_resolve(self) -> list[str]:
        return [u for u in self._static if dns_name(u)]

    def resolved(self, url: str, urls: list[str]) -> None:
        """Set what a configured URL stands for now (empty: keep the URL itself)."""
        if self._resolved.get(url) != urls:
            self._resolved[url] = urls
            self._rebuild()

    def add(self, url: str) -> None:
        """A managed worker that passed its health gate: a fresh start, whatever its URL did
        (in every serving process at once: they probe it only every few seconds)."""
        if url not in self._managed:
            self._managed.append(url)
            self.health.pop(url, None)
            self._rebuild()
            self._share(self.health[url], url)

    def remove(self, url: str) -> None:
        """A managed worker that stopped or fails its probes; down in every serving process
        at once (the parent process runs the workers and sees one exit first)."""
        if url in self._managed:
            h = self.health[url]
            h.probe_ok = False
            self._share(h, url)
            self._managed.remove(url)
            self._rebuild()

    def _rebuild(self) -> None:
        out: list[str] = []
        hosts: dict[str, str] = {}
        for url in self._static:
            for u in self._resolved.get(url) or [url]:
                if u not in out:
                    out.append(u)
                    if u != url:
                        hosts[u] = urlsplit(url).netloc.rpartition("@")[2]
        gone_hosts, self.hosts = self.hosts, hosts
        self._static_all = list(out)
        self._all = out + [u for u in self._managed if u not in out]
        # managed workers come in gated by their supervisor's probe; static ones await theirs.
        # A new standing (an upstream listed again: a worker restarted, an address back in
        # DNS) owes nothing to attempts begun before it: their verdicts and ends are stale.
        self.health = {u: self.health.get(u) or self._fresh(u in out) for u in self._all}
        if self.board is not None:  # addresses gone from DNS: the board forgets them
            for u in gone_hosts.keys() - self.health.keys():
                self.board.forget(self.model, u, shared=True)
        self.ring = affinity.Ring(self._all)
        if self.pending():
            self.on_pending()

    def _fresh(self, static: bool) -> Health:
        ticket = next(self._tickets)
        return Health(probe_ok=None if static else True, since=ticket, born=ticket)

    def pending(self) -> list[str]:
        """Static upstreams not probed yet."""
        return [u for u in self._static_all if self.health[u].probe_ok is None]

    def healthy(self) -> list[str]:
        """Upstreams a request may be sent to now (a half-open one counts until its trial)."""
        now = self.clock()
        return [u for u in self._all if self.health[u].available(now)]

    def usable(self, url: str) -> bool:
        """Whether a request may go to `url` now, as `healthy` counts: a retry checks the
        order its request was given, which other requests' failures may have made stale."""
        h = self.health.get(url)
        return h is not None and h.available(self.clock())

    def in_rotation(self) -> list[str]:
        """Upstreams passing their probe and not ejected (half-open ones included): what
        /health and readiness count; as every serving process sees them now."""
        self.sync()
        now = self.clock()
        return [u for u in self._all if self.health[u].counted(now)]

    def in_service(self) -> list[str]:
        """Upstreams passing their probe and neither ejected nor half-open: what the health
        gauge counts; as every serving process sees them now."""
        self.sync()
        return [u for u in self._all
                if self.health[u].probe_ok is True and not self.health[u].ejected_until]

    def sync(self) -> None:
        """Take on what other serving processes decided since (gateway.board): the newest
        standing of each upstream wins. Not reported: the process that decided reported it."""
        if self.board is None:
            return
        wall, now = self.wall(), self.clock()
        for url in self._all:
            h = self.health[url]
            s = self.board.read(self.model, url)
            if s is None or s == h.shared or (h.shared is not None and s.at < h.shared.at):
                continue
            h.shared, h.backoff = s, s.backoff
            if s.probe_ok is not None:
                h.probe_ok = s.probe_ok
            if s.until:  # ejected there; half-open here too once its time is over
                h.ejected_until = now + max(0.0, s.until - wall)
            elif not h.ejected_until:
                continue
            else:
                h.ejected_until = 0.0
            h.failures, h.trial, h.since = 0, False, next(self._tickets)

    def _share(self, h: Health, url: str) -> None:
        if self.board is not None:
            h.shared = h.standing(self.wall(), self.clock())
            self.board.publish(self.model, url, h.shared)

    def order(self, key: str | None = None) -> list[str]:
        """Every available upstream once, the policy's choice first: attempt 1 there, retries
        after. `key` is the prompt's opening (`affinity.prefix_key`), used by `prefix` only."""
        urls = self.healthy() or [u for u in self._all
                                  if self.health[u].probe_ok is not False]  # panic
        if len(urls) < 2:
            return urls
        if self.policy == "least_request":
            return self._least_request(urls)
        if self.policy == "prefix" and key is not None:
            return self.ring.walk(key, urls, self._load, affinity.EPSILON)
        start = next(self._counter) % len(urls)
        return urls[start:] + urls[:start]

    def _load(self, url: str) -> float:
        h = self.health[url]
        return h.in_flight + h.queued

    def _least_request(self, urls: list[str]) -> list[str]:
        """Power of two choices: the lighter of two random upstreams, then the rest by load."""
        n = len(urls)  # two distinct ones, uniformly: random.sample's draw, without its
        i = int(random.random() * n)  # microsecond of Python checks a request
        j = int(random.random() * (n - 1))
        j += j >= i
        health = self.health
        loads: list[float] = []  # each read once
        for u in urls:
            h = health[u]
            loads.append(h.in_flight + h.queued)
        first = i if loads[i] <= loads[j] else j
        rest = [k for k in range(n) if k != first]  # lightest first, ties in their order
        if n > SORT_ABOVE:
            rest.sort(key=loads.__getitem__)
        else:  # an insertion sort, native compiled: no key function called per upstream
            for at in range(1, len(rest)):
                k = rest[at]
                while at and loads[rest[at - 1]] > loads[k]:
                    rest[at] = rest[at - 1]
                    at -= 1
                rest[at] = k
        return [urls[first], *[urls[k] for k in rest]]

    # Request accounting: begin/end bracket an attempt; succeeded/failed judge the worker.
    # `ticket` is what begin() returned; None (tools, tests): the trial if one is out, else an
    # attempt begun now.

    def begin(self, url: str) -> int:
        """An attempt starts; its ticket. The first after the backoff is the half-open trial."""
        ticket = next(self._tickets)
        h = self.health.get(url)
        if h is not None:
            h.in_flight += 1
            if h.ejected_until and h.ejected_until <= self.clock() and not h.trial:
                h.trial, h.since = True, ticket
        return ticket

    def end(self, url: str, ticket: int | None = None) -> None:
        """An attempt is over; a half-open trial that ended without a verdict (its client
        left) lets the next request try."""
        h = self.health.get(url)
        if h is not None and (ticket is None or ticket >= h.born):
            h.in_flight = max(0, h.in_flight - 1)
            if h.trial and ticket in (None, h.since):
                h.trial = False

    def succeeded(self, url: str, ticket: int | None = None) -> None:
        h = self.health.get(url)
        if h is None or self._ticket(h, ticket) < h.since:  # began before its ejection
            return
        if h.ejected_until:
            self._restore(url, h)
        h.failures, h.backoff = 0, 0.0

    def failed(self, url: str, ticket: int | None = None) -> bool:
        """Count a worker failure (never a 4xx); True when it ejected the upstream."""
        h = self.health.get(url)
        if h is None:
            return False
        ticket = self._ticket(h, ticket)
        if h.ejected_until:  # only its half-open trial's failure: out again, for longer
            if ticket != h.since:
                return False
            return self._eject(url, h, h.backoff * 2)
        if ticket < h.since:  # began before it was last restored: judged already
            return False
        h.failures += 1
        if h.failures < self.settings.eject_after:
            return False
        return self._eject(url, h, h.backoff * 2)  # twice as long if no request succeeded since

    def probed(self, url: str, ok: bool, why: str = "") -> None:
        """An active probe's verdict (`why`: what failed); once the backoff is over it stands
        for the trial."""
        h = self.health.get(url)
        if h is None:
            return
        changed = h.probe_ok != ok
        if changed and (h.probe_ok is not None or not ok):
            self.listener.probe_changed(self.model, url, ok, why)
        h.probe_ok = ok
        if h.ejected_until and h.ejected_until <= self.clock():
            if ok:
                self._restore(url, h)
            else:  # out while its probe fails anyway; reported as a probe change
                self._eject(url, h, h.backoff * 2, report=False)
        elif changed:
            self._share(h, url)

    def _ticket(self, h: Health, ticket: int | None) -> int:
        if ticket is not None:
            return ticket
        return h.since if h.trial else next(self._tickets)

    def _eject(self, url: str, h: Health, backoff: float, report: bool = True) -> bool:
        s = self.settings
        h.backoff = min(max(backoff, s.backoff), s.backoff_max)
        h.ejected_until = self.clock() + h.backoff
        h.trial, h.since = False, next(self._tickets)
        self._share(h, url)
        if report:
            self.listener.ejected(self.model, url, h.backoff)
        return True

    def _restore(self, url: str, h: Health) -> None:
        h.failures, h.ejected_until, h.trial, h.since = 0, 0.0, False, next(self._tickets)
        self._share(h, url)
        self.listener.restored(self.model, url)

    def loaded(self, url: str, queued: float) -> None:
        h = self.health.get(url)
        if h is not None:
            h.queued = queued
