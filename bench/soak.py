"""Soak: does anything in the gateway grow with traffic? Not a test: it measures and prints.

Starts two simulators and `python -m gateway serve` (as a process) with several models,
aliases, a LoRA adapter model, API keys and CORS on, then drives rounds of mixed requests:
every client protocol, streamed and whole, worker faults in prompts, clients that leave at
random points, bad bodies, unknown models and paths, random x-request-id / Origin /
X-Opaque-Id values, gzip bodies, keep-alive and not. After each round, at rest: the serving
processes' RSS and open fds, and the series of each /metrics family; with `--traced` (one
serving process) a tracemalloc snapshot diff of the gateway between rounds. Round 3 against
round 2 is what tells (round 1 warms caches).

    python bench/soak.py [--workers 1|2] [--rounds 3] [--requests 6000] [--traced]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["k-one", "k-two"]
FAULTS = ["", "", "", "", "", "[[sim fail=503]]", "[[sim fail=500]]", "[[sim fail=429]]",
          "[[sim drop_before]]", "[[sim drop_after=2]]", "[[sim error_after=2]]",
          "[[sim fail=503 fail_times=1]]"]
HANGS: list[Any] = []  # requests with no whole answer in time, printed after their round
LEAVES = ["full"] * 8 + ["body", "early", "mid"]
CONFIG = """\
server:
  workers: {workers}
  api_keys: [{keys}]
  failover_attempts: 1
  drain_seconds: 1
  timeouts: {{connect: 1, first_byte: 2, idle: 1, request_read: 2}}
  health: {{backoff: 0.5, backoff_max: 1, probe_interval: 0.5, probe_timeout: 1}}
default_model: chat
models:
  - name: chat
    aliases: [my-chat, chat-2]
    backend: vllm
    upstreams: [{a}, {b}]
  - name: other
    backend: openai
    upstreams: [http://localhost:{b_port}]
    lmi: {{tgi_compat: true}}
  - name: lora
    aliases: [my-lora]
    backend: vllm
    upstream_model: base-lora
    upstreams: [{a}]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ the request mix


def _rid(rng: random.Random) -> str:
    return uuid.UUID(int=rng.getrandbits(128)).hex


def make(rng: random.Random, i: int) -> tuple[str, str, dict[str, str], bytes, str]:
    """(method, path, headers, body, leave) of the i-th request of the mix."""
    text = f"soak {i} {rng.choice(FAULTS)}"
    model = rng.choice(["chat", "my-chat", "other", "lora", "chat",
                        f"invented-{rng.getrandbits(32):x}"])
    stream = rng.random() < 0.6
    msgs = [{"role": "user", "content": text}]
    kinds: list[tuple[str, str, Any]] = [
        ("POST", "/v1/chat/completions", {"model": model, "messages": msgs, "stream": stream,
                                          "max_tokens": 6, "n": rng.choice([1, 2]),
                                          "stream_options": {"include_usage": True}}
         if stream else {"model": model, "messages": msgs, "max_tokens": 6}),
        ("POST", "/v1/completions", {"model": model, "prompt": text, "stream": stream,
                                     "max_tokens": 6}),
        ("GET", "/v1/models", None),
        ("POST", "/invocations", {"messages": msgs, "max_tokens": 6, "stream": stream}),
        ("POST", "/invocations", {"inputs": text, "parameters": {"max_new_tokens": 6},
                                  "stream": stream,
                                  "adapters": rng.choice(["lora", "my-lora", "", "nope"])}),
        ("POST", f"/predictions/{model}", {"prompt": text, "max_tokens": 6, "stream": stream}),
        ("POST", "/generate", {"inputs": text, "parameters": {"max_new_tokens": 6}}),
        ("POST", "/generate_stream", {"inputs": text, "parameters": {"max_new_tokens": 6}}),
        ("POST", "/", {"inputs": text, "parameters": {"max_new_tokens": 6}, "stream": stream}),
        ("GET", "/info", None),
        ("GET", "/health", None),
        ("GET", "/ping", None),
        ("POST", f"/_inference/chat_completion/{model}/_stream",
         {"messages": msgs, "max_completion_tokens": 6}),
        ("POST", f"/_inference/{model}/_unified", {"messages": msgs}),
        ("POST", f"/_inference/completion/{model}", {"input": text}),
        ("POST", f"/_inference/completion/{model}/_stream", {"input": text}),
        ("POST", f"/nowhere/{rng.getrandbits(32):x}", {"x": 1}),
        ("GET", f"/v1/models/{rng.getrandbits(24):x}", None),
        ("POST", "/v1/chat/completions", b"{not json"),
        ("POST", "/v1/chat/completions", {"model": model, "messages": "nope",
                                          "temperature": "hot"}),
        ("POST", "/generate", {"inputs": text, "parameters": {"top_p": 7}}),
    ]
    method, path, body = rng.choice(kinds)
    raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
    headers = {"host": "gw", "x-request-id": _rid(rng)}
    key = rng.random()
    if key < 0.45:
        headers["authorization"] = f"Bearer {rng.choice(KEYS)}"
    elif key < 0.8:
        headers["x-api-key"] = rng.choice(KEYS)
    elif key < 0.9:
        headers["authorization"] = f"Bearer wrong-{rng.getrandbits(32):x}"
    if rng.random() < 0.3:
        headers["origin"] = f"https://site-{rng.getrandbits(32):x}.example"
    if rng.random() < 0.2:
        headers["x-opaque-id"] = _rid(rng)
    if rng.random() < 0.1 and path == "/invocations":
        headers["x-amzn-sagemaker-adapter-identifier"] = rng.choice(["lora", "zzz"])
    if rng.random() < 0.05:
        headers["x-request-id"] = "x" * rng.randint(100, 2000)
    if method == "POST":
        headers["content-type"] = "application/json"
        if rng.random() < 0.15:
            raw = gzip.compress(raw)
            headers["content-encoding"] = "gzip"
        headers["content-length"] = str(len(raw))
    if rng.random() < 0.03 and "origin" in headers:
        method = "OPTIONS"
        headers["access-control-request-method"] = "POST"
        headers["access-control-request-headers"] = f"content-type,x-{rng.getrandbits(16):x}"
        raw = b""
        headers.pop("content-length", None)
    return method, path, headers, raw, rng.choice(LEAVES)


async def _answer(reader: asyncio.StreamReader, leave: str) -> bool:
    """Reads one answer; True when the connection may carry another request."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if leave == "mid":  # the first bytes of the answer, then gone
        size = int(hdrs.get("content-length", 64))
        await (reader.readexactly(min(size, 64)) if size < 64 else reader.read(64))
        return False
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif "content-length" in hdrs:
        await reader.readexactly(int(hdrs["content-length"]))
    else:
        await reader.read()
        return False
    return hdrs.get("connection", "").lower() != "close"


async def connection(port: int, reqs: list[tuple[str, str, dict[str, str], bytes, str]],
                     keep_alive: bool) -> Counter[str]:
    """Requests on one connection (several when keep-alive), each left as its `leave` says."""
    seen: Counter[str] = Counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    except (OSError, TimeoutError):
        seen["connect_failed"] += 1
        return seen
    try:
        for n, (method, path, headers, body, leave) in enumerate(reqs):
            last = n == len(reqs) - 1 or not keep_alive
            hdrs = {**headers, "connection": "close" if last else "keep-alive"}
            head = f"{method} {path} HTTP/1.1\r\n" + "".join(
                f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
            if leave == "body" and body:
                writer.write(head.encode() + body[: len(body) // 2])
                await writer.drain()
                await asyncio.sleep(random.uniform(0, 0.03))
                seen["left_body"] += 1
                return seen
            writer.write(head.encode() + body)
            await writer.drain()
            if leave == "early":
                await asyncio.sleep(random.uniform(0, 0.03))
                seen["left_early"] += 1
                return seen
            more = await asyncio.wait_for(_answer(reader, leave), 15)
            seen["answered" if leave != "mid" else "left_mid"] += 1
            if not more or last:
                return seen
    except TimeoutError:
        seen["hang"] += 1
        HANGS.append((method, path, headers, body[:200], leave, n))
    except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.LimitOverrunError):
        seen["cut"] += 1
    finally:
        writer.transport.abort()
    return seen


async def drive(port: int, rng: random.Random, start: int, count: int, parallel: int) -> Counter[str]:
    """`count` requests, `parallel` connections at a time."""
    total: Counter[str] = Counter()
    sem = asyncio.Semaphore(parallel)
    i = start

    async def one(reqs: list[Any], keep: bool) -> None:
        async with sem:
            total.update(await connection(port, reqs, keep))

    tasks = []
    while i < start + count:
        keep = rng.random() < 0.5
        k = rng.randint(1, 6) if keep else 1
        reqs = [make(rng, j) for j in range(i, i + k)]
        i += k
        await sem.acquire()  # bound the tasks waiting, not only those running
        sem.release()
        tasks.append(asyncio.ensure_future(one(reqs, keep)))
    await asyncio.gather(*tasks)
    return total


# ------------------------------------------------------------------ measurements


def serving_pids(gateway_pid: int) -> list[int]:
    """The gateway process and its Python children (serving processes, not simulators)."""
    out = [gateway_pid]
    try:
        kids = Path(f"/proc/{gateway_pid}/task/{gateway_pid}/children").read_text().split()
    except OSError:
        kids = []
    for kid in map(int, kids):
        try:
            cmd = Path(f"/proc/{kid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"multiprocessing" in cmd:
            out.append(kid)
    return out


def proc_numbers(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open fds) of a process."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def series(port: int) -> Counter[str]:
    """Series per metric family in /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    fams: Counter[str] = Counter()
    names: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.append(line.split()[2])
        elif line and not line.startswith("#"):
            sample = line.split("{")[0].split(" ")[0]
            fam = max((n for n in names if sample.startswith(n)), key=len, default=sample)
            fams[fam] += 1
    return fams


def at_rest(port: int, limit: float = 20.0) -> None:
    """Until nothing is in flight (bounded)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        busy = [ln for ln in text.splitlines()
                if ln.startswith("gateway_requests_in_flight{") and float(ln.split()[-1]) != 0]
        if not busy:
            return
        time.sleep(0.2)
    print("  (still in flight after the wait)")


def snapshot(pid: int, path: Path) -> tracemalloc.Snapshot | None:
    path.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.with_suffix(".done").exists():
            path.with_suffix(".done").unlink()
            return tracemalloc.Snapshot.load(str(path))
        time.sleep(0.2)
    return None


# ------------------------------------------------------------------ the run


def traced_serve(argv: list[str]) -> int:
    """`python -X tracemalloc=25 bench/soak.py _serve ...`: the gateway, with SIGUSR1
    writing a snapshot (after a full collection) to $SOAK_SNAPSHOT."""
    import gc

    sys.path.insert(0, str(ROOT))  # this checkout's gateway, not an installed one
    from gateway import cli

    def dump(signum: int, frame: object) -> None:
        gc.collect()
        out = Path(os.environ["SOAK_SNAPSHOT"])
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        snap.dump(str(out))
        out.with_suffix(".done").touch()

    signal.signal(signal.SIGUSR1, dump)
    return cli.main(argv)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--parallel", type=int, default=48)
    ap.add_argument("--traced", action="store_true", help="tracemalloc diffs (workers 1)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmd: list[str], log: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=(tmp / log).open("wb"),
                             stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        procs.append(p)
        return p

    def wait(url: str, limit: float = 120) -> None:  # tracemalloc makes imports slow
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"{url} not up; logs in {tmp}")

    try:
        sims = []
        for name in ("a", "b"):
            port = free_port()
            start([sys.executable, "-m", "gateway", "simulate", "--port", str(port),
                   "--ttft-ms", "2", "--itl-ms", "2", "--tokens", "5"], f"sim-{name}.log")
            sims.append(port)
        for port in sims:
            wait(f"http://127.0.0.1:{port}/health")
        cfg = tmp / "gateway.yaml"
        cfg.write_text(CONFIG.format(workers=args.workers, keys=", ".join(KEYS),
                                     a=f"http://127.0.0.1:{sims[0]}",
                                     b=f"http://127.0.0.1:{sims[1]}", b_port=sims[1]))
        gw_port = free_port()
        snap_path = tmp / "snap.bin"
        cmd = ([sys.executable, "-X", "tracemalloc=25", str(Path(__file__)), "_serve"]
               if args.traced else [sys.executable, "-m", "gateway"])
        gw = start([*cmd, "serve", "--config", str(cfg), "--port", str(gw_port),
                    "--log-level", "warning"], "gateway.log", {"SOAK_SNAPSHOT": str(snap_path)})
        wait(f"http://127.0.0.1:{gw_port}/health")
        time.sleep(1.0)
        rng = random.Random(args.seed)
        before = series(gw_port)
        prev = snapshot(gw.pid, snap_path) if args.traced else None
        print(f"gateway pid {gw.pid}, workers {args.workers}, logs in {tmp}")
        for rnd in range(1, args.rounds + 1):
            t0 = time.monotonic()
            seen = asyncio.run(drive(gw_port, rng, rnd * 1_000_000, args.requests, args.parallel))
            took = time.monotonic() - t0
            at_rest(gw_port)
            time.sleep(6.0)  # the workers' keep-alive (5 s) and a probe round
            pids = serving_pids(gw.pid)
            numbers = [proc_numbers(p) for p in pids]
            fams = series(gw_port)
            grown = {k: f"{before.get(k, 0)}->{v}" for k, v in fams.items()
                     if v != before.get(k, 0)}
            before = fams
            print(f"round {rnd}: {args.requests} requests in {took:.1f}s {dict(seen)}")
            print("  rss KiB / fds per process: " + ", ".join(
                f"{p}: {r} / {f}" for p, (r, f) in zip(pids, numbers, strict=True)))
            for hang in HANGS[:3]:
                print(f"  hang: {hang}")
            HANGS.clear()
            print(f"  series total {sum(fams.values())}; changed: {grown}")
            if args.traced:
                snap = snapshot(gw.pid, snap_path)
                if snap is not None and prev is not None:
                    stats = snap.compare_to(prev, "traceback")
                    total = sum(s.size_diff for s in stats)
                    print(f"  tracemalloc: {total / 1024:+.0f} KiB since the last round; top:")
                    for s in stats[:8]:
                        print(f"    {s.size_diff / 1024:+.1f} KiB {s.count_diff:+d} blocks")
                        for line in s.traceback.format()[-12:]:
                            print("      " + line)
                prev = snap
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        sys.exit(traced_serve(sys.argv[2:]))
    sys.exit(main())
