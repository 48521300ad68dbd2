"""A serving process's life: the app's startup, listening, draining on SIGTERM, shutdown.

Order (the lifecycle log events of `gateway serve`): the lifespan starts the app (managed
workers, `ready`), then the socket listens (`listening`). SIGTERM or SIGINT logs `drain`: the
socket stops accepting, idle keep-alive connections close, answers under way get up to
`server.drain_seconds` to finish (each then closes its connection); what is left after that is
cancelled, which the endpoint tells its client (a 503, or the protocol's in-band error and the
stream's end), given `CUT_GRACE` to be written, and the lifespan's shutdown runs (`stop`).
A signal while the app still starts (waiting for a managed worker) cancels the start: the
lifespan stops what it started, the socket never listens, and the exit code is 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from gateway import config, cors, http_server, observability

BACKLOG = 2048
CUT_GRACE = 1.0  # seconds for answers cut at the drain's end to write their error and close

Scope = MutableMapping[str, Any]
Asgi = Callable[[Scope, Any, Any], Awaitable[None]]


class Servable(Protocol):
    """What `gateway.app.build_app` returns: an ASGI app, its fixed routes called natively,
    and its lifespan."""

    native: dict[tuple[str, str], http_server.Endpoint]

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None: ...

    async def dispatch(self, scope: Scope, receive: Any, send: Any) -> None:
        """The app without its CORS middleware (this server answers CORS: gateway.cors)."""

    def match(self, method: str, path: str) -> tuple[http_server.Endpoint,
                                                     dict[str, Any]] | None: ...

    def lifespan(self) -> contextlib.AbstractAsyncContextManager[None]: ...


class Server:
    """The gateway's HTTP server for one process (`gateway.http_server` connections)."""

    def __init__(self, app: Servable, cfg: config.ServerConfig):
        self.asgi: Asgi = app.dispatch
        self.native = app.native
        self.cors = cors.policy(cfg.cors)
        self.servable = app
        self.cfg = cfg
        self.head_timeout = cfg.timeouts.request_read
        self.keep_alive_timeout = cfg.timeouts.keep_alive
        self.connections: set[http_server.Connection] = set()
        self.draining = False
        self._stop: asyncio.Event | None = None
        self._starting: asyncio.Task[int] | None = None  # serve(), until the app has started

    def run(self, sockets: list[socket.socket] | None = None) -> int:
        """Serve until SIGTERM/SIGINT on uvloop; the exit code (1: the app did not start)."""
        import uvloop

        return uvloop.run(self.serve(sockets))

    async def serve(self, sockets: list[socket.socket] | None = None) -> int:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig)
        log = observability.logger()
        self._starting = asyncio.current_task()
        try:
            async with self.servable.lifespan():
                self._starting = None
                async with self._listening(sockets):
                    await self._stop.wait()
                await self._drain()
        except asyncio.CancelledError:
            if not self._stop.is_set():
                raise
            # request_stop() during the app's startup (a worker still starting): the
            # lifespan has stopped what it started; nothing listened, nothing to drain.
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        except OSError as exc:  # the address: in use, not this host's; one line, no traceback
            log.error("serve_failed", host=self.cfg.host, port=self.cfg.port, error=str(exc))
            return 1
        except Exception as exc:  # startup failed (a worker that never came up): a bug's trace
            log.error("serve_failed", error=str(exc), exc_info=exc)
            return 1
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        return 0

    async def app(self, scope: Scope, receive: Any, send: Any) -> None:
        await self.asgi(scope, receive, send)

    def match(self, method: str, path: str) -> tuple[http_server.Endpoint,
                                                     dict[str, Any]] | None:
        return self.servable.match(method, path)

    def request_stop(self, sig: int = signal.SIGTERM) -> None:
        if self._stop is not None and not self._stop.is_set():
            observability.logger().info("drain", signal=signal.Signals(sig).name,
                                        drain_seconds=self.cfg.drain_seconds)
            self._stop.set()
            if self._starting is not None:  # a start waiting on its workers ends now
                self._starting.cancel()

    @contextlib.asynccontextmanager
    async def _listening(self, sockets: list[socket.socket] | None) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def factory() -> http_server.Connection:
            return http_server.Connection(self)

        if sockets:
            servers = [await loop.create_server(factory, sock=s, backlog=BACKLOG)
                       for s in sockets]
        else:
            servers = [await loop.create_server(factory, host=self.cfg.host, port=self.cfg.port,
                                                backlog=BACKLOG, reuse_address=True)]
        bound = [s.getsockname()[:2] for srv in servers for s in srv.sockets]
        observability.logger().info("listening", addresses=[f"{h}:{p}" for h, p in bound])
        try:
            yield
        finally:
            self.draining = True
            for srv in servers:
                srv.close()
            await asyncio.gather(*(srv.wait_closed() for srv in servers), return_exceptions=True)

    async def _drain(self) -> None:
        """Idle connections close now; answers under way get `drain_seconds`, then are cut:
        cancelled first, so that each ends with its protocol's error, then closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.drain_seconds
        for conn in list(self.connections):
            if conn.idle():
                conn.close()
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.05)
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            observability.logger().warning("drain_expired", cut=len(tasks))
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=CUT_GRACE)
        for conn in list(self.connections):
            conn.close()
