"""The gateway's per-chunk work on the wire, without the kernel: the real HTTP server protocol
(`gateway.http_server`) and the real upstream client (`gateway.http1`) in one process, joined
by in-memory transports, S streams interleaved. Not a test.

    python bench/wire_inproc.py [--streams 256] [--tokens 64] [--rounds 20] [--batches 1]
                                [--whole] [--profile N] [--calls]

`bench/inproc.py` runs the endpoint with a worker response that hands each part straight to
the pump, and a client that keeps nothing: it leaves out both connections' protocol code. Here
every byte goes the way it goes in `gateway serve`: the client's request is fed to a
`http_server.Connection` (httptools), the endpoint sends the worker's request through a real
`http1.Http1Client` whose connections are `http1.Connection`s, and the worker's answer
(bench/fast_upstream.py's bytes: the simulator's own, HTTP/1.1 chunked, one SSE event a chunk)
comes back one part per `data_received`, as a paced stream's reads do; what the gateway writes
to its client goes through `Cycle.write_body`'s framing to a transport whose `write` keeps the
bytes in a list (a C call), emptied each round. Only the sockets are missing: no epoll, no
`read`/`write` system calls, no uvloop transport code (what bench/python_floor.py pays).

A round: S client connections (kept alive across rounds) each send one streamed chat request;
when every stream has its first part, the driver hands part k to stream 1, 2, ..., S, then
part k+1 to each, ... (S = 256: each stream's objects are cold again when its next part comes,
as at 256 paced clients; S = 1: always warm), turning the event loop once between parts of a
stream. Printed: CPU µs and Python calls (`--calls`, sys.setprofile: C calls included, as
cProfile counts) per chunk written to the client (65 a 64-token stream, as bench/inproc.py
counts them), and per worker read. For callgrind run it at two `--rounds` and divide the
difference in instructions by the difference in chunks:

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python bench/wire_inproc.py \\
        --streams 256 --rounds 1 --warmup 1

`--whole`: each client connection sends one non-streamed chat request a round, and the
worker's whole answer (bench/fast_upstream.py's: Content-Length, the simulator's JSON) comes
back in one `data_received`; what is printed is then per request (one write each). Against
`bench/inproc.py` (the endpoint alone) the difference is the two connections' per-request
protocol code: parsing the client's request, the response head, the keep-alive cycle, the
worker request's head, the pool, parsing the worker's answer.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
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
from gateway import config, http1, http_server, listener, observability  # noqa: E402

CONFIG = {"server": {"host": "127.0.0.1", "port": 0}, "default_model": "demo",
          "models": [{"name": "demo", "backend": "vllm", "upstreams": ["http://127.0.0.1:9"]}]}


class ClientTransport:
    """The client connection's transport: what the gateway writes is appended to `out`."""

    def __init__(self, out: list[bytes]):
        self.write = out.append  # a C call, as uvloop's write is
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name in ("sockname", "peername") else default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


class WorkerTransport(ClientTransport):
    """The worker connection's transport: a request written to it is answered by the head
    and the stream's first part in the next loop turn; the driver feeds the rest."""

    def __init__(self, harness: Harness, conn: http1.Connection):
        super().__init__([])
        self.harness = harness
        self.conn = conn
        self.write = self._request  # type: ignore[method-assign]

    def _request(self, data: bytes) -> None:
        self.harness.opened(self.conn)


class FakeClient(http1.Http1Client):
    """The real client; its connections are made on in-memory transports."""

    def __init__(self, harness: Harness):
        super().__init__(5.0)
        self.harness = harness

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        return 200, ""  # the health checks: not on this path

    async def _connection(self, origin: http1.Origin) -> http1.Connection:
        conn = http1.Connection(origin, self.idle)
        conn.connection_made(WorkerTransport(self.harness, conn))  # type: ignore[arg-type]
        return conn


class Harness:
    def __init__(self, parts: list[bytes], streams: int):
        self.loop = asyncio.get_running_loop()
        self.parts = parts
        self.streams = streams
        self.waiting: list[http1.Connection] = []  # worker connections asked, this round
        self.all_open: asyncio.Future[None] | None = None
        self.out: list[bytes] = []

    def opened(self, conn: http1.Connection) -> None:
        self.waiting.append(conn)
        self.loop.call_soon(conn.data_received, self.parts[0])
        if len(self.waiting) == self.streams and self.all_open is not None:
            self.all_open.set_result(None)

    async def round(self, clients: list[http_server.Connection], request: bytes) -> int:
        """One stream on each client connection; the parts after the first interleaved."""
        self.waiting = []
        self.out.clear()
        self.all_open = self.loop.create_future()
        for c in clients:
            c.data_received(request)
        await self.all_open
        await asyncio.sleep(0)  # the first parts are read and relayed
        conns = self.waiting
        turn = asyncio.sleep
        for part in self.parts[1:]:
            for conn in conns:
                conn.data_received(part)
            await turn(0)
        for _ in range(3):  # the answers' ends: the tasks finish, the connections are free
            await turn(0)
        return len(self.out)


async def run(args: argparse.Namespace) -> None:
    answers = fast_upstream.Answers(await fast_upstream.simulator_answer(args.tokens, True),
                                    await fast_upstream.simulator_answer(args.tokens, False))
    parts = [answers.whole] if args.whole else answers.stream_parts
    cfg = config.Config.model_validate(CONFIG)
    harness = Harness(parts, args.streams)
    app = gateway_app.build_app(cfg, client_factory=lambda _cfg: FakeClient(harness))  # type: ignore[arg-type,return-value]
    server = listener.Server(app, cfg.server)  # type: ignore[arg-type]
    body = orjson.dumps({"model": "demo", "stream": not args.whole, "max_tokens": args.tokens,
                         "messages": [{"role": "user",
                                       "content": "Say something about the benchmark."}]})
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
               b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
               % (len(body), body))
    async with app.lifespan():
        clients = []
        for _ in range(args.streams):
            c = http_server.Connection(server)
            c.connection_made(ClientTransport(harness.out))  # type: ignore[arg-type]
            clients.append(c)
        for _ in range(args.warmup):
            await harness.round(clients, request)
        if args.gc_threshold:
            gc.set_threshold(args.gc_threshold)  # an experiment: the young generation's size
        if args.freeze:
            gc.freeze()  # what was made so far (imports, app, connections) out of collections
        check = b"".join(harness.out)
        done = (check.count(b"HTTP/1.1 200 OK") if args.whole
                else check.count(b"data: [DONE]"))
        if done != args.streams or b"HTTP/1.1 200 OK" not in check:
            raise SystemExit(f"the answers did not complete: {check[:400]!r}")
        prof = cProfile.Profile() if args.profile else None
        best = float("inf")
        writes = 0
        calls = 0
        for _ in range(args.batches):  # the least disturbed batch: the machine may be shared
            writes = 0
            counter = _Calls() if args.calls else None
            collections = _Collections()
            gc.callbacks.append(collections)
            t0 = time.process_time()
            if prof is not None:
                prof.enable()
            if counter is not None:
                sys.setprofile(counter)
            for _ in range(args.rounds):
                writes += await harness.round(clients, request)
            sys.setprofile(None)
            gc.callbacks.remove(collections)
            if prof is not None:
                prof.disable()
            best = min(best, time.process_time() - t0)
            calls = counter.n if counter is not None else 0
    reads = args.rounds * args.streams * len(parts)
    if args.whole:
        served = args.rounds * args.streams
        print(f"whole answers on {args.streams} connections, {args.rounds} rounds, "
              f"{writes / served:.1f} client writes a request: "
              f"{best / served * 1e6:.2f} µs CPU per request"
              + (f"; {calls / served:.1f} Python calls per request" if args.calls else "")
              + f"; collections by generation {collections.runs}, "
              f"{collections.seconds / served * 1e6:.2f} µs a request")
    else:
        print(f"streams {args.streams}, {args.rounds} rounds, {len(parts)} worker reads and "
              f"{writes / args.rounds / args.streams:.1f} client writes a stream: "
              f"{best / writes * 1e6:.2f} µs CPU per chunk written, "
              f"{best / reads * 1e6:.2f} per read"
              + (f"; {calls / writes:.1f} Python calls per chunk written" if args.calls else "")
              + f"; collections by generation {collections.runs}, "
              f"{collections.seconds / writes * 1e6:.2f} µs a chunk (by generation: "
              + ", ".join(f"{t / writes * 1e6:.2f}" for t in collections.by_generation) + ")")
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(os.environ.get("SORT", "tottime")).print_stats(
            args.profile)
        print(out.getvalue())


class _Collections:
    """gc.callbacks: collections per generation and the CPU time they took."""

    def __init__(self) -> None:
        self.runs = [0, 0, 0]
        self.by_generation = [0.0, 0.0, 0.0]
        self.seconds = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            took = time.process_time() - self._t0
            self.seconds += took
            self.by_generation[info["generation"]] += took
            self.runs[info["generation"]] += 1


class _Calls:
    """sys.setprofile hook: Python and C function calls (what cProfile counts)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.n += 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batches", type=int, default=1,
                   help="run the rounds this many times; report the least CPU")
    p.add_argument("--whole", action="store_true",
                   help="one non-streamed request a connection a round, the worker's whole "
                        "answer in one read; figures per request")
    p.add_argument("--freeze", action="store_true",
                   help="gc.freeze() after the warm-up (an experiment)")
    p.add_argument("--gc-threshold", type=int, default=0, metavar="N",
                   help="gc.set_threshold(N) after the warm-up (an experiment; CPython's is 700)")
    p.add_argument("--calls", action="store_true",
                   help="count Python and C calls (sys.setprofile; slows the run)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cProfile: print the N functions with the most own time")
    args = p.parse_args()
    if not os.environ.get("WIRE_LOG"):
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the per-request log lines
    observability.configure("info")
    import uvloop

    uvloop.run(run(args))


if __name__ == "__main__":
    main()
