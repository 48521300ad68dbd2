"""The simulator's HTTP server: a plain ASGI app speaking vLLM's OpenAI API, run by uvicorn.

A plain ASGI callable with a dict router keeps the per-chunk path to one `send` of prebuilt
bytes. Each generation request runs beside a watcher task that waits on `receive()`, so a
client that goes away is noticed at once (even mid-sleep) and counted as aborted, as vLLM's
engine aborts the request (`AsyncLLM.generate` on CancelledError).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from simulator import chat, completions, directives, engine, jobs, render, tokens
from simulator.control import Connection, Stats
from simulator.settings import SimulatorSettings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
_NOT_FOUND = b'{"detail":"Not Found"}'  # FastAPI's default 404
_NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'
_ENDPOINTS = {"/v1/chat/completions": chat, "/v1/completions": completions}
_RENDERS: dict[bool, Callable[[jobs.Job], render.Render]] = {
    True: chat.ChatRender,
    False: completions.CompletionRender,
}


async def _read_body(receive: Receive) -> bytes:
    """The whole request body."""
    parts = []
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            break
        parts.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    return b"".join(parts)


async def _respond(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A complete JSON response."""
    headers = [render.JSON_TYPE, (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _headers(scope: Scope) -> dict[str, str]:
    """Request headers, lower-cased names, last one wins."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _model_list(settings: SimulatorSettings) -> bytes:
    """ModelList as vLLM 0.11 serves it: one card per served name, root = the model path."""
    now = int(time.time())
    names = settings.model_names or (settings.served_name,)
    permission = {
        "id": "modelperm-" + tokens.digest("perm").hex()[:32],
        "object": "model_permission",
        "created": now,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    cards = [
        {
            "id": name,
            "object": "model",
            "created": now,
            "owned_by": "vllm",
            "root": names[0],
            "parent": None,
            "max_model_len": settings.max_model_len,
            "permission": [permission],
        }
        for name in names
    ]
    return orjson.dumps({"object": "list", "data": cards})


class SimulatorApp:
    """The ASGI app; all state (counters, fail memory, last request) lives on the instance."""

    def __init__(self, settings: SimulatorSettings) -> None:
        self.settings = settings
        self.stats = Stats()
        self.engine = engine.Engine(settings)
        self.fails = directives.FailMemory()
        self.last_request: dict[str, Any] = {"path": None, "headers": {}, "body": None}
        self.routes: dict[str, tuple[str, Callable[[Scope, Receive, Send], Awaitable[None]]]] = {
            "/health": ("GET", self._health),
            "/metrics": ("GET", self._metrics),
            "/v1/models": ("GET", self._models),
            "/v1/chat/completions": ("POST", self._generate),
            "/v1/completions": ("POST", self._generate),
            "/_sim/stats": ("GET", self._stats),
            "/_sim/reset": ("POST", self._reset),
            "/_sim/last_request": ("GET", self._last),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route one ASGI event."""
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return None
        route = self.routes.get(scope["path"])
        if route is None:
            return await _respond(send, 404, _NOT_FOUND)
        if scope["method"] != route[0]:
            return await _respond(send, 405, _NOT_ALLOWED)
        return await route[1](scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Nothing to set up or tear down; acknowledge both phases."""
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                return await send({"type": "lifespan.shutdown.complete"})

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM /health: 200, empty body."""
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
        )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM /metrics: Prometheus text with the engine's queue and cache gauges."""
        body = self.engine.metrics()
        headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                   (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM /v1/models."""
        await _respond(send, 200, _model_list(self.settings))

    async def _stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Counters for tests: requests, active, completed, aborted, last_abort_at."""
        await _respond(send, 200, orjson.dumps(self.stats.as_dict()))

    async def _reset(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Zero the counters and forget `fail_times` counts."""
        await _read_body(receive)
        self.stats.reset()
        self.fails.reset()
        await _respond(send, 200, orjson.dumps(self.stats.as_dict()))

    async def _last(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The last generation request as received: path, headers, parsed body."""
        await _respond(send, 200, orjson.dumps(self.last_request))

    def _record(self, scope: Scope, raw: bytes) -> tuple[dict[str, Any] | None, dict[str, str]]:
        """Remember the request for /_sim/last_request; return its JSON object body and headers."""
        headers = _headers(scope)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        self.last_request = {"path": scope["path"], "headers": headers, "body": body}
        return (body if isinstance(body, dict) else None), headers

    async def _generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A chat or completions request, from body to the last byte, with fault directives."""
        raw = await _read_body(receive)
        self.stats.begin()
        conn = Connection(receive, send, self.stats)
        try:
            await self._serve(scope, raw, conn)
        except asyncio.CancelledError:
            if conn.client_gone():
                self.stats.abort()
            elif not await conn.cut_on_shutdown():
                raise
        finally:
            conn.close()
            self.stats.end()

    async def _serve(self, scope: Scope, raw: bytes, conn: Connection) -> None:
        """Parse, apply pre-stream faults, then answer (streaming or not)."""
        body, headers = self._record(scope, raw)
        rid = jobs.request_id(body or {}, headers.get("x-request-id"))
        extra = [(b"x-request-id", rid.encode("latin-1", "replace"))]
        if body is None:
            message = "JSON decode error" if raw.strip() else "Field required: request body"
            return await self._error(conn, jobs.SimError(message), extra)
        endpoint = _ENDPOINTS[scope["path"]]
        try:
            faults = directives.parse(endpoint.directive_texts(body))
            if faults.drop_before:
                return await conn.drop()
            if self.fails.should_fail(faults):
                assert faults.fail is not None
                raise jobs.SimError(
                    f"Simulated failure (fail={faults.fail})",
                    faults.fail,
                    render.error_type(faults.fail),
                )
            if self.settings.fail_status:
                status = self.settings.fail_status
                raise jobs.SimError("Simulated failure (--fail-status)", status,
                                    render.error_type(status))
            job = endpoint.parse(body, self.settings, faults, rid)
        except (jobs.SimError, directives.DirectiveError) as exc:
            err = exc if isinstance(exc, jobs.SimError) else jobs.SimError(str(exc))
            return await self._error(conn, err, extra)
        r = _RENDERS[job.chat](job)
        async with self.engine.slot():
            job.ttft_s += self.engine.prefill_s(job.prompts[0])
            await (
                _stream(job, r, conn, extra, self.engine)
                if job.stream
                else _whole(job, r, conn, extra)
            )

    async def _error(
        self, conn: Connection, err: jobs.SimError, extra: list[tuple[bytes, bytes]]
    ) -> None:
        """vLLM's JSON error body with the error's status."""
        conn.finishing()
        await _respond(
            conn.send,
            err.status,
            render.error_body(err.message, err.status, err.err_type, err.param),
            extra,
        )
        self.stats.complete()


async def _fault(job: jobs.Job, conn: Connection) -> None:
    """The stream fault due now: in-band error then [DONE], dropped connection, or a hang."""
    f = job.faults
    if f.error_after == f.cut_after:
        conn.finishing()
        error = render.stream_error("Simulated engine error (error_after)")
        await conn.send(
            {"type": "http.response.body", "body": error + render.DONE, "more_body": False}
        )
        return conn.stats.complete()
    if f.drop_after == f.cut_after:
        return await conn.drop()
    await conn.hang()


async def _stream(
    job: jobs.Job,
    r: render.Render,
    conn: Connection,
    extra: list[tuple[bytes, bytes]],
    pace: engine.Engine,
) -> None:
    """SSE: role chunks with the first tokens after TTFT, a step per ITL (longer in a bigger
    batch), usage, [DONE]."""
    send, outcomes, cut = conn.send, job.outcomes, job.faults.cut_after
    await send(
        {"type": "http.response.start", "status": 200, "headers": render.SSE_HEADERS + extra}
    )
    loop = asyncio.get_running_loop()
    due = loop.time() + job.ttft_s  # steps keep to absolute times: no drift under load
    await asyncio.sleep(job.ttft_s)
    pending = r.opening()
    for k in range(max(len(o.tokens) for o in outcomes)):
        if k == cut:
            return await _fault(job, conn)
        if k:  # sleep(0) at itl 0 still lets other streams (and the watcher) run
            due += job.itl_s * pace.step_factor()
            await asyncio.sleep(max(0.0, due - loop.time()))
        chunks = [r.step(c, k) for c, o in enumerate(outcomes) if k < len(o.tokens)]
        await send(
            {"type": "http.response.body", "body": pending + b"".join(chunks), "more_body": True}
        )
        pending = b""
    conn.finishing()
    end = pending + r.closing() + render.DONE  # `pending`: role chunks when no step ran
    await send({"type": "http.response.body", "body": end, "more_body": False})
    conn.stats.complete()


async def _whole(
    job: jobs.Job, r: render.Render, conn: Connection, extra: list[tuple[bytes, bytes]]
) -> None:
    """Non-streaming: wait as long as generation would take, then one JSON body."""
    steps = max(len(o.tokens) for o in job.outcomes)
    cut = job.faults.cut_after
    shown = steps if cut is None else min(steps, cut)
    await asyncio.sleep(job.ttft_s + job.itl_s * max(0, shown - 1))
    if cut is not None and cut < steps:
        if job.faults.error_after == cut:  # vLLM: an engine error before the body is a 500
            conn.finishing()
            message = "Simulated engine error (error_after)"
            await _respond(conn.send, 500, render.error_body(message, 500), extra)
            return conn.stats.complete()
        if job.faults.drop_after == cut:
            return await conn.drop()
        return await conn.hang()
    conn.finishing()
    await _respond(conn.send, 200, r.body(), extra)
    conn.stats.complete()


def build_app(settings: SimulatorSettings) -> SimulatorApp:
    """The simulator as an ASGI app (all state inside it, nothing global)."""
    return SimulatorApp(settings)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulator's command-line options (shared by `gateway simulate` and `-m`)."""
    d = SimulatorSettings()
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument(
        "--model-name",
        dest="model_names",
        action="append",
        default=[],
        help="served model name (repeatable); none: accept any name",
    )
    parser.add_argument("--ttft-ms", type=float, default=d.ttft_ms, help="time to first token")
    parser.add_argument("--itl-ms", type=float, default=d.itl_ms, help="delay between tokens")
    parser.add_argument("--tokens", type=int, default=d.tokens, help="natural output length")
    parser.add_argument("--reasoning", action="store_true", help="emit reasoning_content first")
    parser.add_argument("--seed", type=int, default=d.seed, help="changes every output")
    parser.add_argument("--max-batch", type=int, default=d.max_batch,
                        help="requests decoded at once; more wait in a queue (0: no limit)")
    parser.add_argument("--batch-slowdown", type=float, default=d.batch_slowdown,
                        help="per-token time grows by this fraction per extra running request")
    parser.add_argument("--prefill-ms-per-token", type=float, default=d.prefill_ms_per_token,
                        help="TTFT added per prompt token not in the prefix cache")
    parser.add_argument("--prefix-cache-blocks", type=int, default=d.prefix_cache_blocks,
                        help="KV blocks the prefix cache holds, LRU (0: no cache)")
    parser.add_argument("--block-tokens", type=int, default=d.block_tokens,
                        help="tokens per KV block")
    parser.add_argument("--fail-status", type=int, default=d.fail_status,
                        help="answer every generation request with this HTTP status (0: off)")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=d.max_model_len,
        help="context length (prompt + max_tokens)",
    )


def settings_from_args(args: argparse.Namespace) -> SimulatorSettings:
    """SimulatorSettings from parsed `add_arguments` options."""
    return SimulatorSettings(
        model_names=tuple(args.model_names or ()),
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        tokens=args.tokens,
        reasoning=args.reasoning,
        seed=args.seed,
        max_model_len=getattr(args, "max_model_len", SimulatorSettings().max_model_len),
        **{name: getattr(args, name) for name in _CAPACITY if hasattr(args, name)},
    )


_CAPACITY = ("max_batch", "batch_slowdown", "prefill_ms_per_token", "prefix_cache_blocks",
             "block_tokens", "fail_status")


def run_from_args(args: argparse.Namespace) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn handles both, then drains for up to 3 s)."""
    import uvicorn

    uvicorn.run(
        build_app(settings_from_args(args)),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
