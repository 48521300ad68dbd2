"""The interface of the pooled HTTP client that talks to workers, and two implementations.

Production uses `gateway.http1` (asyncio Protocols + httptools), which the benchmark in bench/
measured against these (see README, Performance): `AiohttpClient` (one session, unlimited
connector) stays selectable there; `HttpxClient` serves respx-mocked tests.
Foreign exceptions are translated once, here: before the status line they are
`UpstreamUnavailable` (retryable), after it `UpstreamBroken`.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncIterator, Iterator
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp
import httpx

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


def failure(exc: BaseException, timeout: float) -> str:
    """A probe's failure in words: the exception's type and text, or the time it waited."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return f"no answer within {timeout:g}s"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


UNREACHABLE = "the model's workers could not be reached"
BROKE_OFF = "the worker's answer broke off"
BAD_URL = "the model's upstream URL is not valid"
# A URL no client can send to: retrying it elsewhere or later cannot help (issue 12).
_PERMANENT = (aiohttp.InvalidURL, httpx.InvalidURL, httpx.UnsupportedProtocol)


@contextlib.contextmanager
def map_errors(before_status: bool) -> Iterator[None]:
    """Transport failures to the gateway's tree; the phase decides whether a retry may help."""
    try:
        yield
    except _PERMANENT as exc:  # not UpstreamUnavailable: one attempt, a clear error
        raise errors.UpstreamError(BAD_URL, detail=f"{type(exc).__name__}: {exc}") from exc
    except (aiohttp.ClientError, httpx.TransportError, OSError) as exc:
        # The client reads a stable message; the class and text (which name the worker's
        # address) go to the request's log line only.
        what = f"{type(exc).__name__}: {exc}".rstrip(": ")
        if before_status:
            raise errors.UpstreamUnavailable(UNREACHABLE, detail=what) from exc
        raise errors.UpstreamBroken(BROKE_OFF, detail=what) from exc


class AiohttpResponse:
    __slots__ = ("_resp", "retry_after", "status")

    def __init__(self, resp: aiohttp.ClientResponse):
        self._resp = resp
        self.status = resp.status
        self.retry_after = resp.headers.get("retry-after")

    async def read_chunk(self) -> bytes:
        try:  # a plain try, not map_errors: this runs once per chunk
            return await self._resp.content.readany()
        except (aiohttp.ClientError, OSError) as exc:
            with map_errors(before_status=False):
                raise exc from None
        raise AssertionError("unreachable")

    async def read(self) -> bytes:
        with map_errors(before_status=False):
            return await self._resp.read()

    async def aclose(self) -> None:
        if self._resp.content.at_eof():
            self._resp.release()
        else:
            self._resp.close()


class AiohttpClient:
    """One aiohttp session for every worker; created inside the running loop."""

    def __init__(self, connect_timeout: float):
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=10),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def send(self, req: base.UpstreamRequest) -> UpstreamResponse:
        with map_errors(before_status=True):
            resp = await self._session.request(
                req.method, req.url, data=req.body, headers=req.headers)
        return AiohttpResponse(resp)

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        try:
            async with self._session.get(
                    url, timeout=aiohttp.ClientTimeout(total=timeout),
                    headers={"host": host} if host else None) as resp:
                return resp.status, ""
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return 0, failure(exc, timeout)

    async def aclose(self) -> None:
        await self._session.close()


class HttpxResponse:
    __slots__ = ("_chunks", "_resp", "retry_after", "status")

    def __init__(self, resp: httpx.Response):
        self._resp = resp
        self.status = resp.status_code
        self.retry_after = resp.headers.get("retry-after")
        self._chunks: AsyncIterator[bytes] | None = None

    async def read_chunk(self) -> bytes:
        if self._chunks is None:
            self._chunks = aiter(self._resp.aiter_bytes())
        with map_errors(before_status=False):
            async for data in self._chunks:
                if data:
                    return data
        return b""

    async def read(self) -> bytes:
        with map_errors(before_status=False):
            return await self._resp.aread()

    async def aclose(self) -> None:
        await self._resp.aclose()


class HttpxClient:
    """The same interface over an httpx.AsyncClient (respx-mocked in tests)."""

    def __init__(self, client: httpx.AsyncClient):
        self._client = client

    async def send(self, req: base.UpstreamRequest) -> UpstreamResponse:
        with map_errors(before_status=True):
            request = self._client.build_request(
                req.method, req.url, content=req.body, headers=req.headers)
            resp = await self._client.send(request, stream=True)
        return HttpxResponse(resp)

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        try:
            return (await self._client.get(url, timeout=timeout,
                                           headers={"host": host} if host else None)
                    ).status_code, ""
        except (httpx.HTTPError, OSError) as exc:
            return 0, failure(exc, timeout)

    async def aclose(self) -> None:
        await self._client.aclose()


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
