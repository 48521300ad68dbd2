"""The client's side of one request, as an endpoint sees it, whichever server carries it.

`gateway.http_server.Cycle` is one natively; `AsgiPeer` makes one of an ASGI call (Starlette's
routes with path parameters, the tests' ASGI transports, other ASGI servers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Peer(Protocol):
    path: str
    path_params: dict[str, str]
    headers: dict[str, str]  # lower-case names; the last of a repeated header

    @property
    def receive(self) -> Receive:
        """ASGI `http.request` messages, then `http.disconnect`."""
        ...

    @property
    def send(self) -> Send:
        """ASGI `http.response.start` / `http.response.body`."""
        ...

    def on_disconnect(self, fn: Callable[[], None]) -> Callable[[], object]:
        """Call `fn` once if the client goes away; returns what stops watching."""
        ...

    def ready_body(self, limit: int) -> bytes | None:
        """The whole request body, taken, if it is all here already (`receive` would not wait
        for it), not empty and within `limit` bytes; else None, and `receive` reads it."""
        ...


class AsgiPeer:
    """A Peer over an ASGI scope; a disconnect is seen by a task waiting on `receive`, as ASGI
    offers no other way (the native server calls back instead)."""

    __slots__ = ("headers", "path", "path_params", "receive", "send")

    def __init__(self, scope: Scope, receive: Receive, send: Send):
        self.path: str = scope["path"]
        self.path_params: dict[str, str] = scope.get("path_params") or {}
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.receive = receive
        self.send = send

    def on_disconnect(self, fn: Callable[[], None]) -> Callable[[], object]:
        return asyncio.ensure_future(self._watch(fn)).cancel

    def ready_body(self, limit: int) -> bytes | None:
        return None  # ASGI tells only by `receive`

    async def _watch(self, fn: Callable[[], None]) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                fn()
                return
