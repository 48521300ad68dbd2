"""aiohttp's and httpx's clients behind the gateway's upstream interface (gateway.upstream).

The gateway serves with its own (gateway.http1), which the benchmark measured against these
(README, Performance): `AiohttpClient` (one session, unlimited connector) stays selectable
there (bench/run_gateway.py --client aiohttp), and `HttpxClient` serves the respx-mocked
tests. Kept apart so that a serving process never imports either library.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import aiohttp
import httpx

from adapters import base
from gateway import upstream
from schemas import errors

_TIMEOUTS = (TimeoutError, httpx.TimeoutException)
# A URL no client can send to: retrying it elsewhere or later cannot help (issue 12).
_PERMANENT = (aiohttp.InvalidURL, httpx.InvalidURL, httpx.UnsupportedProtocol)


@contextlib.contextmanager
def map_errors(before_status: bool) -> Iterator[None]:
    """Transport failures to the gateway's tree; the phase decides whether a retry may help."""
    try:
        yield
    except _PERMANENT as exc:  # not UpstreamUnavailable: one attempt, a clear error
        raise errors.UpstreamError(upstream.BAD_URL, detail=f"{type(exc).__name__}: {exc}") from exc
    except (aiohttp.ClientError, httpx.TransportError, OSError) as exc:
        # The client reads a stable message; the class and text (which name the worker's
        # address) go to the request's log line only.
        what = f"{type(exc).__name__}: {exc}".rstrip(": ")
        if before_status:
            raise errors.UpstreamUnavailable(upstream.UNREACHABLE, detail=what) from exc
        raise errors.UpstreamBroken(upstream.BROKE_OFF, detail=what) from exc


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

    async def send(self, req: base.UpstreamRequest) -> upstream.UpstreamResponse:
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
            return 0, upstream.failure(exc, timeout, _TIMEOUTS)

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

    async def send(self, req: base.UpstreamRequest) -> upstream.UpstreamResponse:
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
            return 0, upstream.failure(exc, timeout, _TIMEOUTS)

    async def aclose(self) -> None:
        await self._client.aclose()
