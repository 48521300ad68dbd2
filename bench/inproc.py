"""The gateway's own Python work per request, without sockets: CPU µs per whole answer and
per streamed chunk, and (with --profile) where it goes.

    python bench/inproc.py [--requests 20000] [--batches 1] [--tokens 64] [--stream] [--relay callback|await]
                           [--profile N]   (SORT=cumulative: by cumulative time)

Each request runs the real endpoint (`ProtocolEndpoint.serve`: body, parse, route, build the
worker's request, decode, render, log line, metrics) with the upstream client replaced by one
that answers the fast upstream's own bytes (bench/fast_upstream.py) from memory, and the client
connection by one that keeps nothing. What this leaves out is the cost of the sockets and the
HTTP framing on both sides, which bench/bench.py measures with them. Sequential requests, one
event loop (uvloop), the per-request log line written to /dev/null. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import fast_upstream  # noqa: E402
import orjson  # noqa: E402

from gateway import app as gateway_app  # noqa: E402
from gateway import config, observability  # noqa: E402

CONFIG = {"server": {"host": "127.0.0.1", "port": 0}, "default_model": "demo",
          "models": [{"name": "demo", "backend": "vllm", "upstreams": ["http://127.0.0.1:9"]}]}


class CannedResponse:
    __slots__ = ("parts", "status")

    def __init__(self, parts: list[bytes]):
        self.status = 200
        self.parts = list(parts)

    async def read_chunk(self) -> bytes:
        return self.parts.pop(0) if self.parts else b""

    async def read(self) -> bytes:
        out = b"".join(self.parts)
        self.parts = []
        return out

    async def aclose(self) -> None:
        return None

    def close_now(self) -> None:  # as gateway.http1's response: closing never waits
        return None


class CallbackResponse(CannedResponse):
    """As gateway.http1's response under the callback relay (`--relay callback`, what serving
    uses on the gateway's own server): after `attach`, each part goes to the sink from its own
    event-loop callback, as each read of a paced stream arrives in its own `data_received`."""

    __slots__ = ("loop", "paused", "sink")

    def __init__(self, parts: list[bytes]):
        super().__init__(parts)
        self.loop = asyncio.get_running_loop()
        self.sink: Any = None
        self.paused = False

    def attach(self, sink: Any) -> None:
        self.sink = sink
        self.loop.call_soon(self._feed)

    def detach(self) -> None:
        self.sink = None

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            self.loop.call_soon(self._feed)

    def _feed(self) -> None:
        sink = self.sink
        if sink is None or self.paused:
            return
        if self.parts:
            sink.data(self.parts.pop(0))
            self.loop.call_soon(self._feed)
        else:
            self.sink = None
            sink.end(None)


class CannedClient:
    def __init__(self, whole: list[bytes], stream: list[bytes], callback: bool):
        self.whole, self.stream = whole, stream
        self.response = CallbackResponse if callback else CannedResponse

    async def send(self, req: Any) -> CannedResponse:
        return self.response(self.stream if req.streaming else self.whole)

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        return 200, ""

    async def aclose(self) -> None:
        return None


class NullPeer:
    """A client connection that sends one body and keeps nothing of the answer (the await
    relay's ASGI sends; `write_body` is on `WritingPeer` only)."""

    __slots__ = ("body", "chunks", "headers", "path", "path_params")

    def __init__(self, body: bytes):
        self.path = "/v1/chat/completions"
        self.path_params: dict[str, str] = {}
        self.headers = {"content-type": "application/json", "content-length": str(len(body)),
                        "host": "127.0.0.1"}
        self.body = body
        self.chunks = 0

    async def receive(self) -> dict[str, Any]:
        return {"type": "http.request", "body": self.body, "more_body": False}

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.body":
            self.chunks += 1

    def on_disconnect(self, fn: Any) -> Any:
        return _nothing

    def ready_body(self, limit: int) -> bytes | None:  # as http_cycle.Cycle's, all here
        body, self.body = self.body, b""
        return body


class WritingPeer(NullPeer):
    """The client of the gateway's own server (gateway.http_cycle.Cycle): bytes written at
    once by `write_body`, as the callback relay needs."""

    __slots__ = ()

    def write_body(self, body: bytes, more: bool = True) -> bool:
        self.chunks += 1
        return True

    async def drain(self) -> None:
        return None


def _nothing() -> None:
    return None


async def run(args: argparse.Namespace) -> None:
    whole_ct, whole = await fast_upstream.simulator_answer(args.tokens, False)
    stream_ct, stream = await fast_upstream.simulator_answer(args.tokens, True)
    cfg = config.Config.model_validate(CONFIG)
    callback = args.relay == "callback"
    canned = CannedClient(whole, stream, callback)
    peer_type = WritingPeer if callback else NullPeer
    app = gateway_app.build_app(cfg, client_factory=lambda _cfg: canned)  # type: ignore[arg-type,return-value]
    endpoint = app.native[("POST", "/v1/chat/completions")]
    body = orjson.dumps({"model": "demo", "stream": args.stream, "max_tokens": args.tokens,
                         "messages": [{"role": "user",
                                       "content": "Say something about the benchmark."}]})
    async with app.lifespan():
        for _ in range(2000):  # warm-up
            await endpoint(peer_type(body))  # type: ignore[arg-type]
        prof = cProfile.Profile() if args.profile else None
        best = float("inf")
        for _ in range(args.batches):  # the least disturbed batch: the machine may be shared
            chunks = 0
            t0 = time.process_time()
            if prof is not None:
                prof.enable()
            for _ in range(args.requests):
                peer = peer_type(body)
                await endpoint(peer)  # type: ignore[arg-type]
                chunks += peer.chunks
                # the loop turns between requests, as it does at least once per request served
                # (what is batched per turn, the log lines, is then measured per request)
                await asyncio.sleep(0)
            if prof is not None:
                prof.disable()
            best = min(best, time.process_time() - t0)
        cpu = best
    per_req = cpu / args.requests * 1e6
    print(f"{'stream' if args.stream else 'whole'}: {args.requests} requests, "
          f"{per_req:.1f} µs CPU per request, {cpu / max(chunks, 1) * 1e6:.2f} µs per chunk "
          f"sent ({chunks / args.requests:.1f} sends per request)")
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(os.environ.get("SORT", "tottime")).print_stats(args.profile)
        print(out.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--batches", type=int, default=1,
                   help="run the requests this many times; report the least CPU")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--relay", choices=["callback", "await"], default="callback",
                   help="callback: the worker's parts reach the stream from event-loop "
                        "callbacks, as on the gateway's own server (gateway.pump); await: the "
                        "ASGI path's relay")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cProfile: print the N functions with the most own time")
    args = p.parse_args()
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the per-request log lines
    observability.configure("info")
    import uvloop

    uvloop.run(run(args))


if __name__ == "__main__":
    main()
