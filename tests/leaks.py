"""What must never reach a client in an error answer: a worker's address or port, an exception's
class name, or a worker's own body such as a proxy's HTML page (issue 12). `scan` finds them;
tests/conftest.py applies it to every error answer the suite's httpx clients receive."""

from __future__ import annotations

import re

import httpx

PATTERNS = {
    "loopback address": re.compile(rb"127\.0\.0\.1|localhost:|\[::1\]"),
    "address with a port": re.compile(
        rb"(?<![\w\"'])(?:https?://)?(?:\d{1,3}(?:\.\d{1,3}){3}|[a-z][a-z0-9-]*(?:\.[a-z0-9-]+)*)"
        rb":\d{2,5}\b"),
    "exception class name": re.compile(rb"\b[A-Z][A-Za-z]*(?:Error|Exception|Refused|Reset)\w*:"),
    "HTML page": re.compile(rb"<html|<!doctype", re.IGNORECASE),
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
