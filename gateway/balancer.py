"""A model's upstream set: round-robin over base URLs, changed live by DNS and the supervisor.

A configured `http://` upstream whose host is a DNS name (a Kubernetes headless Service, say)
stands for every address the name resolves to; `gateway.resolver` refreshes that expansion,
so scaling workers needs no gateway restart. Managed workers are added once healthy.
"""

from __future__ import annotations

import ipaddress
import itertools
from urllib.parse import urlsplit


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


class Upstreams:
    """Static upstreams from the config (DNS-expanded) plus managed workers."""

    def __init__(self, static: tuple[str, ...] = ()):
        self._static = list(static)
        self._resolved: dict[str, list[str]] = {}
        self._managed: list[str] = []
        self._counter = itertools.count()
        self._all: list[str] = []
        self._rebuild()

    @property
    def all(self) -> list[str]:
        return self._all

    @property
    def to_resolve(self) -> list[str]:
        return [u for u in self._static if dns_name(u)]

    def resolved(self, url: str, urls: list[str]) -> None:
        """Set what a configured URL stands for now (empty: keep the URL itself)."""
        if self._resolved.get(url) != urls:
            self._resolved[url] = urls
            self._rebuild()

    def add(self, url: str) -> None:
        if url not in self._managed:
            self._managed.append(url)
            self._rebuild()

    def remove(self, url: str) -> None:
        if url in self._managed:
            self._managed.remove(url)
            self._rebuild()

    def _rebuild(self) -> None:
        out: list[str] = []
        for url in self._static:
            for u in self._resolved.get(url) or [url]:
                if u not in out:
                    out.append(u)
        self._all = out + [u for u in self._managed if u not in out]

    def order(self) -> list[str]:
        """Every upstream once, starting at the next in turn: attempt 1 there, retries after."""
        urls = self._all
        if not urls:
            return []
        start = next(self._counter) % len(urls)
        return urls[start:] + urls[:start]
