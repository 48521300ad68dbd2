"""`gateway serve | check-config | simulate`, and `--version`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway import version

if TYPE_CHECKING:
    from gateway import config


def parser() -> argparse.ArgumentParser:
    from adapters import registry
    from simulator import server as simulator
    from simulator import worker

    p = argparse.ArgumentParser(prog="gateway", description=registry.SUMMARY)
    p.add_argument("--version", action="version", version=version.describe())
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway",
                           description="Run the gateway. Without --config: model `demo` served "
                                       "by a managed simulator worker.")
    serve.add_argument("--config", help="YAML config file (default: the embedded demo config)")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=port_arg, help="listen port (overrides server.port)")
    serve.add_argument("--workers", type=workers_arg,
                       help="serving processes on the port: N or auto (overrides server.workers)")
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"])

    check = sub.add_parser("check-config", help="validate a config file",
                           description="Validate a config; print each error with its location.")
    check.add_argument("file")

    sim = sub.add_parser("simulate", help="run the simulator worker on its own",
                         description=worker.SUMMARY)
    simulator.add_arguments(sim)
    return p


def port_arg(text: str) -> int:
    """A TCP port, 0-65535 (0: any free port), as server.port takes: the socket layer would
    take 70000 as 70000 mod 65536 and listen on another port than the one asked for."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number in 0-65535")
    return int(text)


def workers_arg(text: str) -> int | str:
    """`auto` or a positive count."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a positive number nor auto")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "check-config":
        return check_config(args.file)
    if args.command == "simulate":
        from simulator import server as simulator

        simulator.run_from_args(args)
        return 0
    return serve(args)


def check_config(path: str) -> int:
    """Every problem of the file in one run, each as `FILE: location: message` (the file
    named once); warnings (stray GATEWAY_* variables, models nothing serves) do not fail it."""
    from gateway import config, routing

    warnings: list[str] = []
    try:
        cfg = config.load_config(path, os.environ, warnings)
    except config.ConfigError as exc:
        problems, cfg = exc.problems, None
    else:
        problems = []
    try:  # its chat_template / tokenizer files, in the same run as the schema's problems
        problems += routing.file_problems(config.read_file(path).get("models"))
    except config.ConfigError:
        pass  # the file itself is unreadable or not YAML: already reported
    try:
        if cfg is not None and not problems:
            routing.Router(cfg)  # what only a whole config shows (a worker's model directory)
    except config.ConfigError as exc:
        problems = exc.problems
    if problems:
        _report(path, problems, warnings)
        return 1
    _report(path, [], warnings)
    print(f"{path}: ok")
    return 0


def _log_report(path: str, problems: list[str], warnings: list[str]) -> None:
    """`serve`'s form of `_report`: JSON log events, like every other line it writes."""
    from gateway import observability

    log = observability.logger()
    for text in warnings:
        log.warning("config_warning", file=path, message=text)
    for text in problems:
        log.error("config_error", file=path, message=text)


def _report(path: str, problems: list[str], warnings: list[str]) -> None:
    for text in warnings:
        print(f"{path}: warning: {text}", file=sys.stderr)
    for text in problems:
        print(f"{path}: {text}", file=sys.stderr)


def _stop_before_serving(signum: int, frame: object) -> None:
    """SIGTERM or SIGINT before the server runs (its own handlers replace this one): nothing
    has started yet, so the gateway just ends, with exit code 0, as a drain of nothing."""
    raise SystemExit(0)


_ANY_HOST = ("0.0.0.0", "::", "")


def _own_port_clashes(cfg: config.Config) -> list[str]:
    """Managed workers set to listen where the gateway itself does: whichever binds second
    fails (vLLM's default port is 8000, a common choice for the gateway's too)."""
    host, port = cfg.server.host, cfg.server.port
    return [f"workers[{i}].port: {w.port} is the gateway's own port (server.port or --port) "
            f"on {w.host}; give the worker another"
            for i, w in enumerate(cfg.workers)
            if w.port and w.port == port
            and (host in _ANY_HOST or w.host in _ANY_HOST or w.host == host)]


def serve(args: argparse.Namespace) -> int:
    # Imports and the app's build take a second or more: a pod deleted then was killed by
    # SIGTERM (exit status 143) and a Ctrl-C printed a traceback.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_before_serving)
    from gateway import app, config, observability, processes, tracing

    observability.configure(args.log_level)  # from here on, every line on stderr is JSON
    log = observability.logger()
    source = args.config or "config"
    warnings: list[str] = []
    try:
        cfg = config.load_config(args.config, os.environ, warnings)
    except config.ConfigError as exc:
        _log_report(source, exc.problems, warnings)
        return 1
    _log_report(source, [], warnings)
    server = cfg.server.model_copy(update={
        k: v for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers))
        if v is not None})
    cfg = cfg.model_copy(update={"server": server})
    if clashes := _own_port_clashes(cfg):  # known only once the flags are in
        _log_report(source, clashes, [])
        return 1
    processes.tune_collector()
    count = processes.count(server.workers)
    log.info("start", host=server.host, port=server.port, models=[m.name for m in cfg.models],
             version=version.version(), build=version.build(), processes=count,
             open_files=processes.raise_open_files_limit())
    try:  # build_app reads chat_template files: it may find more errors
        application = app.build_app(cfg, traces=tracing.from_env(server.tracing, os.environ))
    except config.ConfigError as exc:
        _log_report(source, exc.problems, [])
        return 1
    try:
        if count > 1:
            return processes.serve(cfg, count, args.log_level)
        return processes.server(application, server).run()
    except OSError as exc:  # the address: in use, not this host's, not a host at all
        log.error("serve_failed", host=server.host, port=server.port, error=str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
