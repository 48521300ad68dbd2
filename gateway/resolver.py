"""Keeps DNS-named upstreams expanded to one upstream per address, refreshed on a period."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit, urlunsplit

from gateway import balancer, observability, upstream

Lookup = Callable[[str, int], Awaitable[list[str]]]


async def lookup(host: str, port: int) -> list[str]:
    """IPv4 addresses first (a headless Service's A records), else IPv6, sorted."""
    loop = asyncio.get_running_loop()
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
        except OSError:
            continue
        if infos:
            return sorted({str(info[4][0]) for info in infos})
    return []


def expand(url: str, addresses: list[str]) -> list[str]:
    """One URL per address, each with the name's port and userinfo (its credentials)."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    userinfo = parts.netloc.rpartition("@")[0]
    user = f"{userinfo}@" if userinfo else ""
    return [urlunsplit(parts._replace(netloc=user + (f"[{a}]" if ":" in a else a) + port))
            for a in addresses]


async def refresh(sets: Iterable[balancer.Upstreams], find: Lookup = lookup) -> None:
    """One pass: re-resolve every DNS-named upstream; a failed lookup keeps the last answer."""
    for ups in sets:
        for url in ups.to_resolve:
            parts = urlsplit(url)
            host = parts.hostname or ""
            addresses = await find(host, parts.port or 80)
            if addresses:
                ups.resolved(url, expand(url, addresses))
            else:
                observability.logger().warning("upstream_unresolved",
                                                 upstream=upstream.shown(url))


async def refresh_forever(sets: list[balancer.Upstreams], period: float,
                          find: Lookup = lookup) -> None:
    """From startup on, in the background: until a name first resolves, its URL itself is
    the upstream (the HTTP client resolves it per connection), so nothing waits on DNS."""
    while True:
        await refresh(sets, find)
        await asyncio.sleep(period)
