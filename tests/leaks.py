"""What must never reach a client in an error answer: a worker's address or port, an exception's
class name, a worker's own body such as a proxy's HTML page (issue 12), a server's file paths,
or a validation error's repr that echoes the client's whole body back. `scan` finds them;
`install` (an autouse fixture in tests/conftest.py) applies it to every error answer the
suite's httpx clients read, whole or streamed."""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from gateway import upstream_clients

PATTERNS = {
    "loopback address": re.compile(rb"127\.0\.0\.1|localhost:|\[::1\]"),
    "address with a port": re.compile(
        rb"(?<![\w\"'])(?:https?://)?(?:\d{1,3}(?:\.\d{1,3}){3}|[a-z][a-z0-9-]*(?:\.[a-z0-9-]+)*)"
        rb":\d{2,5}\b"),
    "exception class name": re.compile(rb"\b[A-Z][A-Za-z]*(?:Error|Exception|Refused|Reset)\w*:"),
    "HTML page": re.compile(rb"<html|<!doctype", re.IGNORECASE),
    # a traceback frame or a module's path on the server (FastAPI's RequestValidationError
    # text names the endpoint's file and line: fastapi/exceptions.py ValidationException)
    "server file path": re.compile(rb'File \\?"/|(?:/[\w.-]+)+\.py\b'),
    # a pydantic error dict's repr: its `input` is the client's whole body, echoed back
    "validation error repr": re.compile(rb"'loc': \(|'input': "),
}


def scan(body: bytes) -> list[str]:
    """The kinds of internal detail found in `body`."""
    return [name for name, pattern in PATTERNS.items() if pattern.search(body)]


def is_error_answer(status: int, body: bytes) -> bool:
    """A refusal, or a 200 stream that carries an in-band error event."""
    if status >= 400:
        return True
    return b'"error"' in body or b"event: error" in body or b'"finish_reason": "error"' in body


class Collector:
    """Scans the whole error answers it is shown; `found` lists each leak with its request."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def check(self, request: httpx.Request, resp: httpx.Response) -> None:
        if resp.is_stream_consumed:
            self.check_body(request, resp.status_code, resp.content)

    def check_body(self, request: httpx.Request, status: int, body: bytes) -> None:
        if is_error_answer(status, body) and (kinds := scan(body)):
            self.found.append(f"{request.method} {request.url.path} -> {status} "
                              f"{kinds}: {body[:300]!r}")


# Set while the gateway's own upstream client sends: a mock transport reads a fake worker's
# body in there, and that body is the worker's side, not an answer to a client.
_UPSTREAM_IO: contextvars.ContextVar[bool] = contextvars.ContextVar("upstream_io", default=False)


@contextlib.contextmanager
def worker_side() -> Iterator[None]:
    """A test's own request to a worker (to compare its answer with the gateway's): the
    worker's words, not an answer the gateway gave a client."""
    token = _UPSTREAM_IO.set(True)
    try:
        yield
    finally:
        _UPSTREAM_IO.reset(token)


def install(monkeypatch: pytest.MonkeyPatch) -> Collector:
    """Check every httpx body as it is read to its end (httpx reads a whole answer through
    `aiter_bytes` / `iter_bytes` too), except what upstream_clients.HttpxClient reads from workers."""
    seen = Collector()
    aiter_bytes, iter_bytes = httpx.Response.aiter_bytes, httpx.Response.iter_bytes
    upstream_init, upstream_send = upstream_clients.HttpxResponse.__init__, upstream_clients.HttpxClient.send

    def mark_upstream(self: upstream_clients.HttpxResponse, resp: httpx.Response) -> None:
        resp.extensions["gateway_upstream"] = True
        upstream_init(self, resp)

    async def send_upstream(self: upstream_clients.HttpxClient, req: Any) -> Any:
        token = _UPSTREAM_IO.set(True)
        try:
            return await upstream_send(self, req)
        finally:
            _UPSTREAM_IO.reset(token)

    def answered(resp: httpx.Response, parts: list[bytes]) -> None:
        upstream_side = resp.extensions.get("gateway_upstream") or _UPSTREAM_IO.get()
        if not upstream_side and resp._request is not None:  # None: a fake's own body
            seen.check_body(resp.request, resp.status_code, b"".join(parts))

    async def aiter_checked(self: httpx.Response, *a: Any, **kw: Any) -> AsyncIterator[bytes]:
        parts = []
        async for part in aiter_bytes(self, *a, **kw):
            parts.append(part)
            yield part
        answered(self, parts)

    def iter_checked(self: httpx.Response, *a: Any, **kw: Any) -> Iterator[bytes]:
        parts = []
        for part in iter_bytes(self, *a, **kw):
            parts.append(part)
            yield part
        answered(self, parts)

    monkeypatch.setattr(upstream_clients.HttpxResponse, "__init__", mark_upstream)
    monkeypatch.setattr(upstream_clients.HttpxClient, "send", send_upstream)
    monkeypatch.setattr(httpx.Response, "aiter_bytes", aiter_checked)
    monkeypatch.setattr(httpx.Response, "iter_bytes", iter_checked)
    return seen
