"""Shared test options: `--update-goldens` rewrites golden files instead of comparing."""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from gateway import upstream
from tests import leaks


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite golden files from the current output; review the diff")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


_UPSTREAM_IO: contextvars.ContextVar[bool] = contextvars.ContextVar("upstream_io", default=False)


@pytest.fixture(autouse=True)
def no_internal_details_in_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every error answer any test receives through httpx (in-process gateways, gateway
    processes, fakes alike; whole or streamed) holds no worker address, exception class name
    or HTML page (issue 12). What the gateway's own upstream client reads from fake workers
    (upstream.HttpxResponse) is the workers' side, not an answer, and is not checked."""
    seen = leaks.Collector()
    check = seen.check
    async_send, sync_send = httpx.AsyncClient.send, httpx.Client.send
    aiter_bytes, iter_bytes = httpx.Response.aiter_bytes, httpx.Response.iter_bytes
    upstream_init, upstream_send = upstream.HttpxResponse.__init__, upstream.HttpxClient.send

    def mark_upstream(self: upstream.HttpxResponse, resp: httpx.Response) -> None:
        resp.extensions["gateway_upstream"] = True
        upstream_init(self, resp)

    async def send_upstream(self: upstream.HttpxClient, req: Any) -> Any:
        token = _UPSTREAM_IO.set(True)  # a mock transport reads the fake's body in here
        try:
            return await upstream_send(self, req)
        finally:
            _UPSTREAM_IO.reset(token)

    async def aiter_checked(self: httpx.Response, *a: Any, **kw: Any) -> AsyncIterator[bytes]:
        parts = []
        async for part in aiter_bytes(self, *a, **kw):
            parts.append(part)
            yield part
        if not (self.extensions.get("gateway_upstream") or _UPSTREAM_IO.get()) \
                and self._request is not None:
            seen.check_body(self.request, self.status_code, b"".join(parts))

    def iter_checked(self: httpx.Response, *a: Any, **kw: Any) -> Iterator[bytes]:
        parts = []
        for part in iter_bytes(self, *a, **kw):
            parts.append(part)
            yield part
        if self._request is not None:  # None: a fake's answer, read before any client sent
            seen.check_body(self.request, self.status_code, b"".join(parts))

    monkeypatch.setattr(upstream.HttpxResponse, "__init__", mark_upstream)
    monkeypatch.setattr(upstream.HttpxClient, "send", send_upstream)
    monkeypatch.setattr(httpx.Response, "aiter_bytes", aiter_checked)
    monkeypatch.setattr(httpx.Response, "iter_bytes", iter_checked)

    async def send_async(self: httpx.AsyncClient, request: httpx.Request,
                         **kw: Any) -> httpx.Response:
        resp = await async_send(self, request, **kw)
        if not kw.get("stream"):  # streamed answers are checked as they are read
            check(request, resp)
        return resp

    def send_sync(self: httpx.Client, request: httpx.Request, **kw: Any) -> httpx.Response:
        resp = sync_send(self, request, **kw)
        if not kw.get("stream"):
            check(request, resp)
        return resp

    monkeypatch.setattr(httpx.AsyncClient, "send", send_async)
    monkeypatch.setattr(httpx.Client, "send", send_sync)
    yield
    assert not seen.found, "internal details in error answers:\n" + "\n".join(seen.found)
