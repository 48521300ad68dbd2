"""`server.workers: N` on a machine with cores to spare: whole answers (or streams) through
`gateway serve --workers N` for several N, side by side with nginx at `worker_processes N`,
in one run.

    python bench/scaling.py                         # workers 1,2,4, on cores 1-4 of 16
    python bench/scaling.py --workers 1,2 --case stream-saturated --repeat 3

Layout: the proxy under test on the first N of `--proxy-cores` (`taskset -c`: the kernel
places its N processes there); one static upstream (bench/fast_upstream.py) on each of
`--upstream-cores`, all of them in the proxy's rotation (round robin); one load generator
(bench/loadgen.py) on each of `--load-cores`, the case's clients spread over them. By default
the cores are the usable ones in order (core 0 left out where there are enough): max(N) for
the proxy, as many for the upstreams, the rest (up to twice max(N)) for the load, so that neither upstream nor load caps the proxy
(their share of their cores is printed: near 100% means they did). Where the machine lists
several hardware threads a core, each proxy process gets a physical core to itself (its
sibling threads idle) while the cores suffice; the report names each proxy core's siblings. Clients: `--clients` per
serving process, so that every process has as much to do at every N.

The gateway row is the product's own start (`python -m gateway serve --workers N`, this
checkout on PYTHONPATH), per-request log lines on, as in production. Each row: requests/s
summed over the load generators, the proxy's CPU per request (every process of its tree), and
requests/s over the same target's at N = 1 (the acceptance point of `server.workers`: at
least 1.8 at N = 2). Raw numbers go to bench/results/scaling-*.json. Not a test: nothing here
asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench as harness  # bench/bench.py: this directory is sys.path[0]

HERE, ROOT, PY = harness.HERE, harness.ROOT, harness.PY


def core_list(text: str) -> list[int]:
    """`0-3,8` -> [0, 1, 2, 3, 8] (taskset's list form)."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def cpus(cores: list[int]) -> str:
    return ",".join(map(str, cores))


def siblings(core: int, root: str = "/sys/devices/system/cpu") -> list[int]:
    """The hardware threads sharing `core`'s physical core (itself included), as the kernel
    lists them; [core] where the machine does not say (many virtual machines)."""
    try:
        with open(f"{root}/cpu{core}/topology/thread_siblings_list") as f:
            return core_list(f.read().strip())
    except (OSError, ValueError):
        return [core]


def default_layout(usable: list[int], most: int,
                   sibling_of: dict[int, list[int]] | None = None
                   ) -> tuple[list[int], list[int], list[int]]:
    """(proxy, upstream, load) cores: `most` each for the proxy and the upstreams, then up to
    2 * `most` for the load; fewer cores than 2 * most + 1 cannot keep them apart. Core 0,
    where the kernel's housekeeping and many interrupts land, is left out when there are
    cores enough without it. Where the machine has several hardware threads a core
    (`sibling_of`), each proxy process gets a physical core of its own: its siblings are left
    idle where the cores suffice, so that N processes are not measured against a loaded
    sibling that one process did not have."""
    if len(usable) < 2 * most + 1:
        raise SystemExit(f"{len(usable)} usable cores: workers {most} needs {2 * most + 1} "
                         "(or name --proxy-cores, --upstream-cores, --load-cores)")
    if sibling_of and any(len(sibling_of.get(c, [c])) > 1 for c in usable):
        whole = _whole_cores(usable, most, sibling_of)
        if whole is not None:
            return whole
    if usable[0] == 0 and len(usable) > 2 * most + 1:
        usable = usable[1:]
    return (usable[:most], usable[most:2 * most], usable[2 * most:4 * most])


def _whole_cores(usable: list[int], most: int, sibling_of: dict[int, list[int]]
                 ) -> tuple[list[int], list[int], list[int]] | None:
    """The layout with a physical core per proxy process (its other threads idle), or None
    where the rest would not hold the upstreams and one load core."""
    physical: list[list[int]] = []  # usable threads by physical core, in the order first seen
    seen: dict[int, list[int]] = {}
    for c in usable:
        key = min(sibling_of.get(c, [c]))
        if key not in seen:
            seen[key] = []
            physical.append(seen[key])
        seen[key].append(c)
    for skip_zero in (True, False):
        cores = [p for p in physical if not (skip_zero and 0 in p)]
        proxy = [p[0] for p in cores[:most]]
        rest = [c for p in cores[most:] for c in p]
        if len(proxy) == most and len(rest) >= most + 1:
            return proxy, rest[:most], rest[most:3 * most]
    return None


def gateway_config(tmp: Path, ports: list[int], port: int, workers: int) -> Path:
    path = tmp / f"gateway-{port}.yaml"
    upstreams = ", ".join(f"http://127.0.0.1:{p}" for p in ports)
    path.write_text(
        f"server: {{host: 127.0.0.1, port: {port}, workers: {workers}}}\n"
        "default_model: demo\n"
        "models:\n"
        "  - name: demo\n"
        "    backend: vllm\n"
        "    routing: round_robin\n"
        f"    upstreams: [{upstreams}]\n")
    return path


def start_gateway(procs: harness.Processes, tmp: Path, ports: list[int], workers: int,
                  cores: list[int]) -> tuple[harness.Proc, int]:
    port = harness.free_port()
    conf = gateway_config(tmp, ports, port, workers)
    proc = procs.start("gateway", [PY, "-m", "gateway", "serve", "--config", str(conf)],
                       cpus(cores), tmp / f"gateway-{port}.log", env=harness.with_path(ROOT))
    harness.wait_healthy(proc, f"http://127.0.0.1:{port}/health")
    return proc, port


def serving_tree(proc: harness.Proc, processes: int, timeout: float = 20.0) -> list[int]:
    """The proxy's processes once all of them are up: nginx's master and its N workers; the
    gateway's one process at N = 1, else its parent and N serving processes."""
    deadline = time.monotonic() + timeout
    tree = harness.process_tree(proc.pid)
    while len(tree) < processes and time.monotonic() < deadline:
        time.sleep(0.1)
        tree = harness.process_tree(proc.pid)
    return tree


def load(port: int, case: dict[str, Any], total: int, load_cores: list[int], watch: list[int],
         upstream_pids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Every load generator at once, one per load core; their counts summed. The first one
    also samples the proxy's and the upstreams' CPU over its window."""
    share = [total // len(load_cores) + (i < total % len(load_cores))
             for i in range(len(load_cores))]
    running = []
    for i, (core, n) in enumerate(zip(load_cores, share)):
        if n == 0:
            continue
        cmd = harness.loadgen_command(port, case, n, args)
        if i == 0:
            cmd += [a for pid in watch for a in ("--watch-pid", str(pid))]
            cmd += [a for pid in upstream_pids for a in ("--also-pid", str(pid))]
        running.append(subprocess.Popen(harness.pinned(cmd, core), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, cwd=ROOT))
    results = []
    for p in running:
        try:
            out, err = p.communicate(timeout=args.warmup + args.duration + 60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
            raise
        if p.returncode != 0:
            raise RuntimeError(f"load generator failed ({p.returncode}):\n"
                               f"{err.decode(errors='replace')[-3000:]}")
        results.append(json.loads(out))
    first = results[0]
    req_per_s = sum(r["req_per_s"] for r in results)
    window = first["window_s"]
    proxy_cpu = first["proxy_cpu_s"] or 0.0
    return {
        "req_per_s": req_per_s,
        "chunks_per_s": sum(r["chunks_per_s"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "error_samples": [s for r in results for s in r["error_samples"]][:5],
        "latency_ms_p50": first["latency_ms_p50"],
        "ttft_ms_p50": first["ttft_ms"]["p50"],
        "proxy_cpu_us_per_request": proxy_cpu * 1e6 / (req_per_s * window) if req_per_s else None,
        "proxy_cores_busy": proxy_cpu / window,
        "proxy_sys_share": (first["proxy_sys_s"] or 0.0) / proxy_cpu if proxy_cpu else None,
        "upstream_core_share": (first["also_cpu_s"] or 0.0) / window / max(1, len(upstream_pids)),
        "load_core_share": sum(r["loadgen_cpu_s"] / r["window_s"] for r in results) / len(results),
        "clients": total,
    }


def table(case_name: str, rows: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> str:
    lines = [f"### {case_name}  ({args.clients} clients a serving process, {args.duration:g} s, "
             f"{args.tokens} tokens, {args.repeat} run(s) each: mean, and each run)", "",
             "| target | N | req/s | runs | / N=1 | proxy CPU µs/req | proxy cores busy "
             "(kernel share) | upstream core | load core | p50 latency (ms) | errors |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    base: dict[str, float] = {}
    for label, runs in rows.items():
        target, n = label.rsplit("-", 1)
        mean = sum(r["req_per_s"] for r in runs) / len(runs)
        base.setdefault(target, mean if n == "1" else 0.0)
        ratio = f"{mean / base[target]:.2f}" if base[target] else "–"
        avg = {k: sum(r[k] or 0.0 for r in runs) / len(runs)
               for k in ("proxy_cpu_us_per_request", "proxy_cores_busy", "proxy_sys_share",
                         "upstream_core_share", "load_core_share", "latency_ms_p50")}
        each = " / ".join(format(r["req_per_s"], ",.0f") for r in runs)
        lines.append(
            f"| {target} | {n} | {mean:,.0f} | {each} "
            f"| {ratio} | {avg['proxy_cpu_us_per_request']:.1f} | {avg['proxy_cores_busy']:.2f} "
            f"({avg['proxy_sys_share'] * 100:.0f}%) "
            f"| {avg['upstream_core_share'] * 100:.0f}% | {avg['load_core_share'] * 100:.0f}% "
            f"| {avg['latency_ms_p50']:.2f} | {sum(r['errors'] for r in runs)} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,2,4", help="comma list of N")
    p.add_argument("--case", default="whole-saturated", choices=sorted(harness.CASES))
    p.add_argument("--targets", default="nginx,gateway", help="comma list of nginx, gateway")
    p.add_argument("--clients", type=int, default=32, help="clients per serving process")
    p.add_argument("--duration", "-d", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=1, help="runs per row, interleaved")
    p.add_argument("--proxy-cores", type=core_list)
    p.add_argument("--upstream-cores", type=core_list)
    p.add_argument("--load-cores", type=core_list)
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    args.workers = [int(n) for n in args.workers.split(",")]
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    usable = sorted(os.sched_getaffinity(0))
    proxy, upstream, load_ = default_layout(usable, max(args.workers),
                                            {c: siblings(c) for c in usable}) \
        if not (args.proxy_cores and args.upstream_cores and args.load_cores) else ([], [], [])
    args.proxy_cores = args.proxy_cores or proxy
    args.upstream_cores = args.upstream_cores or upstream
    args.load_cores = args.load_cores or load_
    if len(args.proxy_cores) < max(args.workers):
        p.error(f"--proxy-cores {cpus(args.proxy_cores)}: fewer than {max(args.workers)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "nginx" in args.targets and shutil.which("nginx") is None:
        print("note: nginx is not on PATH; no nginx rows", file=sys.stderr)
        args.targets.remove("nginx")
    case = harness.CASES[args.case]
    os.sched_setaffinity(0, set(args.load_cores))
    report: dict[str, Any] = {
        "command": " ".join(["python", "bench/scaling.py", *(argv or sys.argv[1:])]),
        "args": dict(vars(args)),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "processor": harness.cpu_model(),
                    # hardware threads sharing each proxy core: [c] alone where not shared
                    # or where the machine does not say
                    "proxy_core_siblings": {c: siblings(c) for c in args.proxy_cores}},
        "source": harness.source_state(), "rows": {},
    }
    labels = [f"{t}-{n}" for t in args.targets for n in args.workers]
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(prefix="gateway-scaling-") as tmp_s, \
            harness.Processes() as procs:
        tmp = Path(tmp_s)
        ports = [harness.free_port() for _ in args.upstream_cores]
        upstreams = [procs.start("upstream", [PY, str(HERE / "fast_upstream.py"), "--port",
                                              str(port), "--tokens", str(args.tokens),
                                              "--itl-ms", f"{case['itl_ms']:g}"],
                                 core, tmp / f"upstream-{port}.log",
                                 env=harness.with_path(ROOT))
                     for port, core in zip(ports, args.upstream_cores)]
        for proc, port in zip(upstreams, ports):
            harness.wait_healthy(proc, f"http://127.0.0.1:{port}/health")
        for rep in range(args.repeat):
            for label in labels:
                target, n = label.rsplit("-", 1)
                cores = args.proxy_cores[:int(n)]
                print(f"[{args.case}] {label} #{rep + 1} on cores {cpus(cores)}",
                      file=sys.stderr, flush=True)
                if target == "nginx":
                    proxy, port = harness.start_nginx_on(procs, tmp, ports, False, cpus(cores),
                                                         int(n))
                else:
                    proxy, port = start_gateway(procs, tmp, ports, int(n), cores)
                try:
                    tree = serving_tree(proxy, 1 + int(n) if target == "nginx" or n != "1"
                                        else 1)
                    rows[label].append(load(port, case, args.clients * int(n), args.load_cores,
                                            tree, [u.pid for u in upstreams], args))
                finally:
                    procs.stop(proxy)
    report["rows"] = rows
    print(table(args.case, rows, args), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"scaling-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"results: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
