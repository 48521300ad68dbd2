"""Routing benchmark: round_robin against least_request against prefix on simulated workers.

Not a test: it measures and prints. Four simulator workers with a batch limit, a queue, a
per-token time that grows with the batch and an LRU prefix cache (simulator/engine.py); one
worker is twice as slow (per token and per prefill token); another is killed (SIGKILL) a third
of the way through each run, mid-stream. The workload is multi-turn chats: each simulated
user holds a conversation of `--turns` turns under one of `--systems` long system prompts, the
worker's answer appended to the history each turn, so requests share leading blocks across
users (system prompt) and within a conversation (history). Each policy gets a fresh gateway
and fresh workers, and the same seeded workload.

A second phase points a gateway at one good worker and one answering every request with a
500 and counts the requests the failing one receives: passive ejection should leave it a
few per backoff window.

    python bench/routing.py                   # ~2 min: 3 policies x 20 s + the ejection phase
    python bench/routing.py --duration 10 --users 16 --policies prefix,round_robin
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def start(args: list[str], url: str, health: str, log: Path) -> Proc:
    out = log.open("wb")
    popen = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=out,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    proc = Proc(popen, url, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{args} exited:\n{log.read_text()[-2000:]}")
        try:
            import httpx
            if httpx.get(url + health, timeout=1).status_code == 200:
                return proc
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.05)
    proc.stop()
    raise TimeoutError(f"{url} did not come up:\n{log.read_text()[-2000:]}")


def simulator(tmp: Path, opts: argparse.Namespace, slow: float = 1.0,
              extra: tuple[str, ...] = ()) -> Proc:
    port = free_port()
    args = ["-m", "simulator", "--host", "127.0.0.1", "--port", str(port),
            "--model-name", "m", "--tokens", str(opts.tokens),
            "--ttft-ms", "10", "--itl-ms", str(opts.itl_ms * slow),
            "--prefill-ms-per-token", str(opts.prefill_ms * slow),
            "--max-batch", str(opts.max_batch), "--batch-slowdown", "0.05",
            "--prefix-cache-blocks", str(opts.cache_blocks), *extra]
    return start(args, f"http://127.0.0.1:{port}", "/health", tmp / f"sim-{port}.log")


def gateway(tmp: Path, policy: str, upstreams: list[str]) -> Proc:
    port = free_port()
    cfg = tmp / f"gw-{port}.yaml"
    cfg.write_text(json.dumps({
        "server": {"retries": 2, "timeouts": {"first_byte": 30, "idle": 5},
                   "health": {"probe_interval": 1, "load_interval": 0.25}},
        "default_model": "m",
        "models": [{"name": "m", "backend": "vllm", "routing": policy,
                    "upstreams": upstreams}]}))
    args = ["-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--config", str(cfg)]
    return start(args, f"http://127.0.0.1:{port}", "/health", tmp / f"gw-{port}.log")


@dataclass
class Results:
    ttft: list[float] = field(default_factory=list)
    done: int = 0
    tokens: int = 0
    errors: list[str] = field(default_factory=list)


def systems(n: int, words: int) -> list[str]:
    rng = random.Random(7)
    return [f"You are assistant {i}. " + " ".join(rng.choice(WORDS) for _ in range(words))
            for i in range(n)]


async def turn(session: aiohttp.ClientSession, url: str, messages: list[dict[str, str]],
               opts: argparse.Namespace, res: Results) -> str | None:
    """One streamed chat turn: TTFT to the first content, the answer text, errors noted."""
    body = {"model": "m", "messages": messages, "stream": True, "max_tokens": opts.tokens}
    t0 = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    raw = b""
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                res.errors.append(f"status {resp.status}")
                return None
            async for chunk in resp.content.iter_any():
                raw += chunk
                while b"\n\n" in raw:
                    event, raw = raw.split(b"\n\n", 1)
                    data = event.removeprefix(b"data: ")
                    if data == b"[DONE]":
                        if first is not None:
                            res.ttft.append(first - t0)
                        res.done += 1
                        res.tokens += len(text)
                        return "".join(text)
                    obj = json.loads(data)
                    if "error" in obj:
                        res.errors.append("in-band: " + str(obj["error"].get("message")))
                        return None
                    for c in obj.get("choices") or ():
                        piece = (c.get("delta") or {}).get("content")
                        if piece:
                            first = first or time.perf_counter()
                            text.append(piece)
    except (aiohttp.ClientError, TimeoutError) as exc:
        res.errors.append(type(exc).__name__)
        return None
    res.errors.append("stream ended without [DONE]")
    return None


async def user(uid: int, url: str, prompts: list[str], opts: argparse.Namespace,
               stop_at: float, res: Results) -> None:
    rng = random.Random(uid)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        while time.monotonic() < stop_at:
            messages = [{"role": "system", "content": rng.choice(prompts)}]
            for _ in range(opts.turns):
                if time.monotonic() >= stop_at:
                    return
                question = " ".join(rng.choice(WORDS) for _ in range(12))
                messages.append({"role": "user", "content": question})
                answer = await turn(session, url, messages, opts, res)
                if answer is None:
                    break
                messages.append({"role": "assistant", "content": answer})


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def load(url: str, opts: argparse.Namespace, victim: Proc | None) -> dict[str, Any]:
    res = Results()
    prompts = systems(opts.systems, opts.system_words)
    t0 = time.monotonic()
    stop_at = t0 + opts.duration

    async def killer() -> None:
        await asyncio.sleep(opts.duration / 3)
        if victim is not None:
            victim.stop(signal.SIGKILL)

    kill = asyncio.ensure_future(killer())
    await asyncio.gather(*(user(i, url, prompts, opts, stop_at, res)
                           for i in range(opts.users)))
    kill.cancel()
    elapsed = time.monotonic() - t0
    return {"requests": res.done, "throughput_rps": round(res.done / elapsed, 2),
            "tokens_per_s": round(res.tokens / elapsed, 1),
            "ttft_p50_ms": round(pct(res.ttft, 0.5) * 1000, 1),
            "ttft_p99_ms": round(pct(res.ttft, 0.99) * 1000, 1),
            "errors": len(res.errors), "error_kinds": sorted(set(res.errors))[:5]}


def run_policy(policy: str, opts: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sims = [simulator(tmp, opts), simulator(tmp, opts), simulator(tmp, opts, slow=2.0),
                simulator(tmp, opts)]
        gw = gateway(tmp, policy, [s.url for s in sims])
        try:
            out = asyncio.run(load(gw.url, opts, sims[3]))
        finally:
            gw.stop()
            for s in sims:
                s.stop()
        log = gw.log.read_text(errors="replace")
        out["failovers"] = log.count('"continued":true')
        out["failovers_failed"] = log.count('"continued":false')
        out["ejections"] = log.count('"upstream_ejected"')
        return out


async def ejection_load(url: str, bad: str, opts: argparse.Namespace) -> dict[str, Any]:
    import httpx
    res = Results()
    prompts = systems(2, 20)
    t0 = time.monotonic()
    stop_at = t0 + opts.ejection_duration
    await asyncio.gather(*(user(i, url, prompts, opts, stop_at, res) for i in range(8)))
    got = httpx.get(bad + "/_sim/stats", timeout=5).json()["requests"]
    return {"seconds": round(time.monotonic() - t0, 1), "client_requests": res.done,
            "client_errors": len(res.errors), "failing_upstream_requests": got}


def run_ejection(opts: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        good = simulator(tmp, opts)
        bad = simulator(tmp, opts, extra=("--fail-status", "500"))
        gw = gateway(tmp, "least_request", [good.url, bad.url])
        try:
            return asyncio.run(ejection_load(gw.url, bad.url, opts))
        finally:
            gw.stop()
            good.stop()
            bad.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policies", default="round_robin,least_request,prefix")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per policy")
    p.add_argument("--users", type=int, default=24, help="concurrent conversations")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--systems", type=int, default=16, help="distinct system prompts")
    p.add_argument("--system-words", type=int, default=320, help="system prompt length")
    p.add_argument("--tokens", type=int, default=24, help="answer length")
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--prefill-ms", type=float, default=1.0, help="per uncached prompt token")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--cache-blocks", type=int, default=160, help="prefix cache per worker")
    p.add_argument("--ejection-duration", type=float, default=12.0)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    machine = f"{platform.node()} {platform.processor() or platform.machine()}"
    rows = {}
    for policy in opts.policies.split(","):
        rows[policy] = run_policy(policy, opts)
        print(policy, json.dumps(rows[policy]), flush=True)
    eject = run_ejection(opts) if opts.ejection_duration > 0 else {}
    if eject:
        print("ejection", json.dumps(eject), flush=True)
    print(f"\nmachine: {machine}, {len(__import__('os').sched_getaffinity(0))} cores; "
          f"{opts.users} users, {opts.duration:g} s per policy\n")
    print("| routing | TTFT p50 ms | TTFT p99 ms | req/s | tokens/s | client errors | "
          "streams failed over |")
    print("|---|---|---|---|---|---|---|")
    for policy, r in rows.items():
        print(f"| {policy} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['throughput_rps']} "
              f"| {r['tokens_per_s']} | {r['errors']} | {r['failovers']} |")
    if opts.out:
        opts.out.write_text(json.dumps({"machine": machine, "options": {
            k: str(v) for k, v in vars(opts).items()}, "policies": rows, "ejection": eject},
            indent=2))


if __name__ == "__main__":
    main()
