"""The interface of the pooled HTTP client that talks to workers, and what every client
shares: the words of its failures, a worker's refusal with its Retry-After, what is retried.

Production uses `gateway.http1` (asyncio Protocols + httptools); aiohttp's and httpx's clients
behind the same interface (`gateway.upstream_clients`: the benchmark's comparison and the
respx-mocked tests) are not imported by the gateway itself: aiohttp alone, with the TLS
contexts it builds on import, was a sixth of a serving process's start (bench/RESULTS.md §28).
A client translates its transport's exceptions once: before the status line they are
`UpstreamUnavailable` (retryable), after it `UpstreamBroken`.
"""

from __future__ import annotations

import functools
import re
from typing import Protocol
from urllib.parse import urlsplit

from adapters import base
from schemas import errors


def shown(url: str) -> str:
    """An upstream URL as logs, metrics labels, spans and error details show it: a password
    in its userinfo masked (RFC 9110 section 4.2.4 deprecates userinfo in http URLs for its
    risk of exposing it; as httpx's URL repr masks it). Only the HTTP client sees
    the URL as configured."""
    return url if "@" not in url else _masked(url)


@functools.lru_cache(maxsize=1024)
def _masked(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username}:***@{host}").geturl()


class UpstreamResponse(Protocol):
    status: int
    retry_after: str | None  # the answer's Retry-After field, as the worker wrote it

    async def read_chunk(self) -> bytes:
        """The body bytes that have arrived, as the socket gave them; b"" at the end."""
        ...

    async def read(self) -> bytes: ...

    async def aclose(self) -> None:
        """Close at once; an unfinished body closes the connection so the worker aborts."""
        ...


class UpstreamClient(Protocol):
    async def send(self, req: base.UpstreamRequest) -> UpstreamResponse: ...

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        """GET a health URL: its status, or 0 and why nothing answered (refused, a certificate
        not trusted, no answer in time), what the `upstream_probe` log line says of a worker
        found down. `host`: the Host to name instead of the URL's (an address a DNS name was
        expanded to)."""
        ...

    async def aclose(self) -> None: ...


async def probe(client: UpstreamClient, url: str, timeout: float) -> int:
    """GET a health URL; its status, or 0 when nothing answered."""
    return (await client.check(url, timeout))[0]


def failure(exc: BaseException, timeout: float,
            timeouts: tuple[type[BaseException], ...] = (TimeoutError,)) -> str:
    """A probe's failure in words: the exception's type and text, or the time it waited
    (`timeouts`: the client's own exceptions for that, besides asyncio's)."""
    if isinstance(exc, timeouts):
        return f"no answer within {timeout:g}s"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


UNREACHABLE = "the model's workers could not be reached"
BROKE_OFF = "the worker's answer broke off"
BAD_URL = "the model's upstream URL is not valid"


# RFC 9110 section 10.2.3: delta-seconds, or an HTTP date (IMF-fixdate, as servers write it)
_RETRY_AFTER = re.compile(
    r"\d{1,10}|[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT")


def with_retry_after(exc: errors.GatewayError, retry_after: str | None) -> errors.GatewayError:
    """A worker's 429 or 503 with its Retry-After: the client is told when to come back, as
    the worker told the gateway (openai-python waits that long before its retry, up to a
    minute: _base_client.py `_calculate_retry_timeout`). A value that is neither
    delta-seconds nor an HTTP date is not passed on."""
    if retry_after is not None and exc.status in (429, 503) \
            and _RETRY_AFTER.fullmatch(retry_after):
        exc.retry_after = retry_after
    return exc


async def refusal(backend: base.Backend, resp: UpstreamResponse) -> errors.GatewayError:
    """A worker's error answer (its status and body, as its backend reads them), with the
    Retry-After it gave."""
    return with_retry_after(backend.parse_error(resp.status, await resp.read()),
                            resp.retry_after)


def retriable(exc: BaseException, fresh: bool) -> bool:
    """Whether an attempt that failed before the first byte is asked again (gateway.pipeline):
    a worker that refused or could not be reached (`UpstreamUnavailable`), on the next
    upstream; a worker silent past its wait (`UpstreamTimeout`) only where the next attempt
    goes to an upstream not yet tried (`fresh`, from `Job.pick`), as nginx's default
    `proxy_next_upstream error timeout` moves on. Its connection is closed, so that worker
    aborts the generation; the same slow worker asked again would double the client's wait,
    and a client that retries a 504 itself (elastic-transport) would multiply it."""
    if isinstance(exc, errors.UpstreamTimeout):
        return fresh
    return isinstance(exc, errors.UpstreamUnavailable)
