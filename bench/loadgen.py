"""Load generator for bench/bench.py: N workers, each doing requests back to back.

Run as its own process (bench.py pins it to the load core). It warms up, then measures for a
fixed window, sampling the CPU of the processes named by `--watch-pid` (and of itself) at the
window's edges, and prints one JSON object on stdout.

Two clients, same measurement:
  aiohttp    one ClientSession, unlimited connector (what the brief asked for)
  httptools  one keep-alive asyncio connection per worker, parsed by httptools (C): a much
             cheaper client, so that the load core is not what limits the numbers

Per request: status, time to first byte of the first SSE event (streams) or to the whole
response (non-stream), SSE events counted as `\\n\\n` terminators (a terminator split across two
reads is counted once), and whether a stream ended with `data: [DONE]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httptools

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_split(pid: int) -> tuple[float, float]:
    """(utime, stime) of one process (all its threads), in seconds; zeros when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return 0.0, 0.0
    fields = raw[raw.rindex(b")") + 2:].split()
    # fields[0] is field 3 (state): utime is field 14, stime field 15
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def proc_cpu_seconds(pid: int) -> float:
    return sum(proc_cpu_split(pid))


def cpu_of(pids: list[int]) -> float:
    return sum(proc_cpu_seconds(p) for p in pids)


def sys_of(pids: list[int]) -> float:
    return sum(proc_cpu_split(p)[1] for p in pids)


def cores_busy() -> dict[str, float]:
    """Busy seconds of each core (every state but idle and iowait), from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3:4].isdigit():
                name, *vals = line.split()
                v = [int(x) for x in vals]
                out[name] = (sum(v[:8]) - v[3] - v[4]) / CLK_TCK
                out[name + "_softirq"] = (v[5] + v[6]) / CLK_TCK  # irq + softirq
    return out


@dataclass
class Stats:
    """What the measured window saw."""

    window_start: float = 0.0
    window_end: float = float("inf")
    requests: int = 0  # completed inside the window
    chunks: int = 0  # SSE events (streams) or whole bodies (non-stream) received in the window
    errors: int = 0  # non-200, transport errors, streams without [DONE]
    error_samples: list[str] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)  # seconds, requests started in the window
    latency: list[float] = field(default_factory=list)

    def in_window(self, t: float) -> bool:
        return self.window_start <= t < self.window_end

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what)


def count_events(data: bytes, prev_nl: bool) -> tuple[int, bool]:
    """SSE terminators in `data`, given whether the previous read ended with a lone `\\n`."""
    n = data.count(b"\n\n")
    if prev_nl and data[:1] == b"\n":
        n += 1
    return n, data[-1:] == b"\n" and data[-2:] != b"\n\n"


# ---------------------------------------------------------------- aiohttp client


async def run_aiohttp(args: argparse.Namespace, body: bytes, stats: Stats, stop_at: float) -> None:
    import aiohttp

    url = f"http://{args.host}:{args.port}{args.path}"
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     auto_decompress=False) as session:

        async def worker(i: int) -> None:
            clock = time.perf_counter
            await asyncio.sleep(args.stagger * i / args.concurrency)
            while clock() < stop_at:
                t0 = clock()
                first: float | None = None
                events = 0
                prev_nl = False
                tail = b""
                try:
                    async with session.post(url, data=body, headers=headers) as resp:
                        if args.stream:
                            async for data in resp.content.iter_any():
                                now = clock()
                                if first is None:
                                    first = now
                                n, prev_nl = count_events(data, prev_nl)
                                events += n
                                if stats.in_window(now):
                                    stats.chunks += n
                                tail = (tail + data)[-32:]
                        else:
                            await resp.read()
                        status = resp.status
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    stats.error(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.01)
                    continue
                finish(args, stats, t0, first, clock(), status, tail)

        await asyncio.gather(*(worker(i) for i in range(args.concurrency)))


def finish(args: argparse.Namespace, stats: Stats, t0: float, first: float | None, end: float,
           status: int, tail: bytes) -> None:
    if status != 200:
        stats.error(f"status {status}")
        return
    if args.stream and not tail.rstrip().endswith(b"data: [DONE]"):
        stats.error(f"stream without [DONE]: ...{tail!r}")
        return
    if not args.stream and stats.in_window(end):
        stats.chunks += 1
    if stats.in_window(end):
        stats.requests += 1
    if stats.in_window(t0):
        stats.ttft.append((first if args.stream and first is not None else end) - t0)
        stats.latency.append(end - t0)


# ---------------------------------------------------------------- httptools client


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, stats: Stats, stream: bool):
        self.stats = stats
        self.stream = stream
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.lost = False
        self.reset()

    def reset(self) -> None:
        self.first: float | None = None
        self.prev_nl = False
        self.tail = b""
        self.keep_alive = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:  # fail the request in flight
            if self.done is not None and not self.done.done():
                self.done.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))

    # httptools callbacks
    def on_body(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        if self.stream:
            n, self.prev_nl = count_events(data, self.prev_nl)
            if self.stats.in_window(now):
                self.stats.chunks += n
            self.tail = (self.tail + data)[-32:]

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


async def run_httptools(args: argparse.Namespace, body: bytes, stats: Stats,
                        stop_at: float) -> None:
    loop = asyncio.get_running_loop()
    head = (f"POST {args.path} HTTP/1.1\r\nHost: {args.host}:{args.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    request = head + body

    async def connect() -> _Conn:
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Conn(stats, args.stream), args.host, args.port), 5)
        return conn

    async def worker(i: int) -> None:
        clock = time.perf_counter
        conn: _Conn | None = None
        await asyncio.sleep(args.stagger * i / args.concurrency)
        try:
            while clock() < stop_at:
                try:
                    if conn is None or conn.lost or not conn.keep_alive:
                        if conn is not None and conn.transport is not None:
                            conn.transport.close()
                        conn = await connect()
                    conn.reset()
                    conn.done = loop.create_future()
                    t0 = clock()
                    assert conn.transport is not None
                    conn.transport.write(request)
                    await asyncio.wait_for(conn.done, args.request_timeout)
                except (OSError, TimeoutError, ConnectionError, httptools.HttpParserError) as exc:
                    stats.error(f"{type(exc).__name__}: {exc}")
                    if conn is not None and conn.transport is not None:
                        conn.transport.close()
                    conn = None
                    await asyncio.sleep(0.01)
                    continue
                finish(args, stats, t0, conn.first, clock(), conn.parser.get_status_code(),
                       conn.tail)
        finally:
            if conn is not None and conn.transport is not None:
                conn.transport.close()

    await asyncio.gather(*(worker(i) for i in range(args.concurrency)))


# ---------------------------------------------------------------- main


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    body = json.dumps({
        "model": args.model,
        "messages": [{"role": "user", "content": "Say something about the benchmark."}],
        "max_tokens": args.max_tokens,
        "stream": args.stream,
    }).encode()
    stats = Stats()
    now = time.perf_counter()
    stats.window_start = now + args.warmup
    stats.window_end = stats.window_start + args.duration
    watch = args.watch_pid or []
    me = os.getpid()
    samples: dict[str, Any] = {}

    async def sampler() -> None:
        await asyncio.sleep(max(0.0, stats.window_start - time.perf_counter()))
        samples["t0"], samples["cpu0"], samples["self0"] = (
            time.perf_counter(), cpu_of(watch), proc_cpu_seconds(me))
        samples["sys0"] = sys_of(watch)
        extra0 = [proc_cpu_seconds(p) for p in args.also_pid or []]
        busy0 = cores_busy()
        await asyncio.sleep(max(0.0, stats.window_end - time.perf_counter()))
        samples["t1"], samples["cpu1"], samples["self1"] = (
            time.perf_counter(), cpu_of(watch), proc_cpu_seconds(me))
        samples["sys1"] = sys_of(watch)
        extra1 = [proc_cpu_seconds(p) for p in args.also_pid or []]
        busy1 = cores_busy()
        samples["also"] = sum(extra1) - sum(extra0)
        samples["cores"] = {k: busy1[k] - busy0.get(k, 0.0) for k in busy1}

    run = run_aiohttp if args.client == "aiohttp" else run_httptools
    # The workers stop starting requests at the window's end; what is in flight then finishes
    # (bounded by request_timeout) but is not counted.
    await asyncio.gather(sampler(), run(args, body, stats, stats.window_end))
    window = samples["t1"] - samples["t0"]
    ms = [t * 1000 for t in stats.ttft]
    return {
        "window_s": window,
        "requests": stats.requests,
        "chunks": stats.chunks,
        "errors": stats.errors,
        "error_samples": stats.error_samples,
        "req_per_s": stats.requests / window,
        "chunks_per_s": stats.chunks / window,
        "ttft_ms": {"p50": percentile(ms, 50), "p90": percentile(ms, 90),
                    "p99": percentile(ms, 99), "n": len(ms)},
        "latency_ms_p50": percentile([t * 1000 for t in stats.latency], 50),
        "proxy_cpu_s": samples["cpu1"] - samples["cpu0"] if watch else None,
        "proxy_sys_s": samples["sys1"] - samples["sys0"] if watch else None,
        "loadgen_cpu_s": samples["self1"] - samples["self0"],
        "also_cpu_s": samples["also"] if args.also_pid else None,
        "core_busy_s": samples["cores"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", default="/v1/chat/completions")
    p.add_argument("--model", default="demo")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--stagger", type=float, default=0.0,
                   help="seconds over which the workers' first requests are spread (paced "
                        "cases: one request's duration, so that arrivals do not come in bursts)")
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--client", choices=["aiohttp", "httptools"], default="httptools")
    p.add_argument("--watch-pid", type=int, action="append",
                   help="a proxy process whose CPU is measured over the window (repeatable)")
    p.add_argument("--also-pid", type=int, action="append",
                   help="another process whose CPU is reported (the simulator)")
    args = p.parse_args()
    try:
        import uvloop
        result = uvloop.run(main_async(args))
    except ImportError:
        result = asyncio.run(main_async(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
