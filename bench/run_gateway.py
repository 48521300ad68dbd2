"""Run the gateway for the benchmark, choosing its upstream client and its ASGI server.

    python bench/run_gateway.py --config FILE [--client http1|aiohttp|httpx]
                                [--server native|uvicorn|granian] [--host H] [--port P] [--quiet]

Per-request JSON log lines stay on by default (that is production: `gateway serve` logs at
info); `--quiet` logs at warning only, to see what the log line costs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from gateway import app as gateway_app
from gateway import config, http1, observability, processes, upstream, upstream_clients


def http1_factory(cfg: config.Config) -> upstream.UpstreamClient:
    return http1.Http1Client(cfg.server.timeouts.connect)


def aiohttp_factory(cfg: config.Config) -> upstream.UpstreamClient:
    return upstream_clients.AiohttpClient(cfg.server.timeouts.connect)


def httpx_factory(cfg: config.Config) -> upstream.UpstreamClient:
    """httpx with its default transport; pool limits lifted like the aiohttp connector's, so
    that the comparison is of the clients, not of httpx's default 100/20 connection caps."""
    import httpx

    return upstream_clients.HttpxClient(httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=cfg.server.timeouts.connect),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
    ))


CLIENTS = {"http1": http1_factory, "aiohttp": aiohttp_factory, "httpx": httpx_factory}


def granian_available() -> bool:
    try:
        import granian.server.embed  # noqa: F401
    except ImportError:
        return False
    return True


def serve_native(app: Any, server: config.ServerConfig) -> None:
    from gateway import processes

    processes.server(app, server).run()  # the very setup of `gateway serve`


def serve_uvicorn(app: Any, server: config.ServerConfig) -> None:
    from gateway import processes

    processes.uvicorn_server(app, server).run()  # `gateway serve` before its own server


def serve_granian(app: Any, host: str, port: int) -> None:
    """Granian's embedded server: the app object in this process, on a uvloop loop, with one
    Rust runtime thread (the whole process is pinned to one core by the benchmark)."""
    import asyncio

    import uvloop
    from granian.constants import Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server

    server = Server(app, address=host, port=port, interface=Interfaces.ASGI,
                    runtime_threads=1, backlog=2048, log_level=LogLevels.warning)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop)
        await server.serve()

    uvloop.run(main())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--client", choices=sorted(CLIENTS), default="http1")
    p.add_argument("--server", choices=["native", "uvicorn", "granian"], default="native")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--quiet", action="store_true", help="no per-request log lines")
    args = p.parse_args(argv)

    try:
        cfg = config.load_config(args.config, os.environ)
    except config.ConfigError as exc:
        for problem in exc.problems:
            print(f"{args.config}: {problem}", file=sys.stderr)
        return 1
    server = cfg.server.model_copy(update={
        k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None})
    cfg = cfg.model_copy(update={"server": server})
    observability.configure("warning" if args.quiet else "info")
    processes.tune_collector()  # as `gateway serve` does
    app = gateway_app.build_app(cfg, client_factory=CLIENTS[args.client])

    if args.server == "granian":
        if not granian_available():
            print("granian is not installed (pip install granian)", file=sys.stderr)
            return 2
        serve_granian(app, server.host, server.port)
    elif args.server == "uvicorn":
        serve_uvicorn(app, server)
    else:
        serve_native(app, server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
