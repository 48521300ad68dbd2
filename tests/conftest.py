"""Shared test options: `--update-goldens` rewrites golden files instead of comparing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

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


@pytest.fixture(autouse=True)
def no_internal_details_in_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every error answer any test receives through httpx (in-process gateways, gateway
    processes, fakes alike) holds no worker address, exception class name or HTML page
    (issue 12). Streamed answers read later are not seen here; whole ones are."""
    seen = leaks.Collector()
    check = seen.check
    async_send, sync_send = httpx.AsyncClient.send, httpx.Client.send

    async def send_async(self: httpx.AsyncClient, request: httpx.Request,
                         **kw: Any) -> httpx.Response:
        resp = await async_send(self, request, **kw)
        if not kw.get("stream"):  # streamed sends: the gateway's own upstream client
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
