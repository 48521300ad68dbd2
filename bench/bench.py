"""Gateway benchmark: N concurrent streams through the gateway, directly against the simulator,
and through a plain nginx streaming proxy (the floor), on the same load.

    . .venv/bin/activate
    python bench/bench.py                                  # defaults: N=64, 10 s per run
    python bench/bench.py --client aiohttp,httpx --server native,uvicorn,granian
    python bench/bench.py --cases stream-saturated --duration 5 --py-spy

Layout on a 2-core machine: the proxy under test (gateway or nginx, one worker) on core 0;
the simulator, the load generator and this script on core 1 (`--proxy-core`, `--load-core`).
For each case the simulator is started once with that case's settings and each target
(direct, nginx, every gateway variant) is measured against it in turn: a warm-up, then a
fixed window in which the proxy's CPU (utime+stime of its whole process tree, from /proc) and
the load core's CPU (simulator + load generator) are sampled.

Cases: stream-saturated (inter-token delay 0), stream-paced (20 ms between tokens),
whole-saturated and whole-paced (the same, non-streaming).

Prints one markdown table per case and writes the raw numbers to bench/results/*.json.
Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable

# "clients": a fixed concurrency for the case (else --concurrency)
CASES: dict[str, dict[str, Any]] = {
    "stream-saturated": {"stream": True, "itl_ms": 0.0, "ttft_ms": 0.0},
    "stream-paced": {"stream": True, "itl_ms": 20.0, "ttft_ms": 0.0, "clients": 256},
    "whole-saturated": {"stream": False, "itl_ms": 0.0, "ttft_ms": 0.0},
    "whole-one-client": {"stream": False, "itl_ms": 0.0, "ttft_ms": 0.0, "clients": 1},
    "whole-paced": {"stream": False, "itl_ms": 20.0, "ttft_ms": 0.0},
}


def clients(case: dict[str, Any], args: argparse.Namespace) -> int:
    return int(case.get("clients") or args.concurrency)


# ---------------------------------------------------------------- processes


def pinned(cmd: list[str], core: int | str | None) -> list[str]:
    """`taskset -c CORE cmd` (CORE: one core, or a list such as `0-3`): taskset execs, so the
    pid we get is the command's own."""
    return cmd if core is None else ["taskset", "-c", str(core), *cmd]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children_of(pid: int) -> list[int]:
    """Direct children, from /proc (the `children` file, else a scan of every /proc/N/stat)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        pass
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            if int(raw[raw.rindex(b")") + 2:].split()[1]) == pid:
                out.append(int(entry))
    return out


def process_tree(pid: int) -> list[int]:
    pids: list[int] = []
    todo = [pid]
    while todo and len(pids) < 256:
        p = todo.pop()
        pids.append(p)
        todo.extend(children_of(p))
    return pids


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    extra_pids: list[int] = field(default_factory=list)  # e.g. nginx workers, killed last

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Processes:
    """Every process this benchmark starts, stopped by its own pid: terminate, bounded wait,
    kill. Used as a context manager so that errors and Ctrl-C stop them too."""

    def __init__(self) -> None:
        self.running: list[Proc] = []

    def start(self, name: str, cmd: list[str], core: int | str | None, log: Path,
              env: dict[str, str] | None = None) -> Proc:
        with open(log, "wb") as out:
            popen = subprocess.Popen(pinned(cmd, core), stdout=out, stderr=subprocess.STDOUT,
                                     cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
        proc = Proc(name, popen, log)
        self.running.append(proc)
        return proc

    def stop(self, proc: Proc, grace: float = 5.0) -> None:
        if proc in self.running:
            self.running.remove(proc)
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.popen.terminate()
            try:
                proc.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(grace)
        for pid in proc.extra_pids:  # children that outlived a killed parent
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for proc in reversed(list(self.running)):
            self.stop(proc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def cores_busy_now(cores: list[int], interval: float) -> list[float]:
    """Busy fraction of each core over `interval` seconds, from /proc/stat."""
    def read() -> dict[int, tuple[int, int]]:
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu") and line[3:4].isdigit():
                    name, *vals = line.split()
                    v = [int(x) for x in vals[:8]]
                    out[int(name[3:])] = (sum(v) - v[3] - v[4], sum(v))
        return out
    a = read()
    time.sleep(interval)
    b = read()
    return [(b[c][0] - a[c][0]) / max(1, b[c][1] - a[c][1]) for c in cores]


def wait_quiet(cores: list[int], limit: float, threshold: float = 0.1) -> float:
    """Wait (at most `limit` s) until the cores are idle for a second: other people's work on a
    shared machine would otherwise land in the measured window. Returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if max(cores_busy_now(cores, 1.0)) < threshold:
            break
    return time.monotonic() - start


def wait_healthy(proc: Proc, url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n"
                               f"{proc.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
                last = f"status {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} not healthy at {url} after {timeout:g}s ({last}):\n"
                       f"{proc.log_tail()}")


# ---------------------------------------------------------------- targets


def start_simulator(procs: Processes, tmp: Path, case: dict[str, Any], args: argparse.Namespace,
                    port: int) -> Proc:
    """The worker every target of a case is measured against: `--upstream fast` (default) is
    bench/fast_upstream.py, static bytes with the simulator's shape, so that the worker does
    not cap what the proxies show; `--upstream simulator` is the simulator itself."""
    settings = ["--host", "127.0.0.1", "--port", str(port), "--ttft-ms", f"{case['ttft_ms']:g}",
                "--itl-ms", f"{case['itl_ms']:g}", "--tokens", str(args.tokens)]
    cmd = ([PY, str(HERE / "fast_upstream.py")] if args.upstream == "fast"
           else [PY, "-m", "simulator"]) + settings
    proc = procs.start("simulator", cmd, args.load_core, tmp / f"simulator-{port}.log",
                       env=with_path(ROOT))
    wait_healthy(proc, f"http://127.0.0.1:{port}/health")
    return proc


def gateway_config(tmp: Path, sim_port: int, port: int) -> Path:
    path = tmp / f"gateway-{port}.yaml"
    path.write_text(
        f"server: {{host: 127.0.0.1, port: {port}}}\n"
        "default_model: demo\n"
        "models:\n"
        "  - name: demo\n"
        "    backend: vllm\n"
        f"    upstreams: [http://127.0.0.1:{sim_port}]\n")
    return path


def compiled_copy(dest: Path) -> Path:
    """This tree in `dest`, its hot modules compiled at -O3 (build_support/compiled_tree.py)."""
    sys.path.insert(0, str(ROOT))
    try:
        from build_support import compiled_tree
    finally:
        sys.path.remove(str(ROOT))
    print("building the compiled tree ...", file=sys.stderr)
    done = compiled_tree.build(dest)
    if done.returncode != 0:
        raise SystemExit("the compiled build failed:\n" + done.stdout[-3000:] + done.stderr[-3000:])
    return dest


def with_path(root: Path) -> dict[str, str]:
    """This environment with `root` first on PYTHONPATH (what was there stays after it)."""
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


def start_gateway(procs: Processes, tmp: Path, variant: dict[str, Any], sim_port: int,
                  args: argparse.Namespace) -> tuple[Proc, int]:
    port = free_port()
    conf = gateway_config(tmp, sim_port, port)
    root = Path(variant.get("root") or ROOT)
    cmd = [PY, str(root / "bench" / "run_gateway.py"), "--config", str(conf), "--server",
           variant["server"], "--host", "127.0.0.1", "--port", str(port)]
    if variant.get("client"):
        cmd += ["--client", variant["client"]]
    if variant["quiet"]:
        cmd.append("--quiet")
    # its own checkout's packages first on the path (this one's too: an editable install in
    # the venv may point at another tree)
    env = with_path(root)
    proc = procs.start("gateway", cmd, args.proxy_core, tmp / f"{variant['label']}-{port}.log",
                       env=env)
    wait_healthy(proc, f"http://127.0.0.1:{port}/health")
    return proc, port


NGINX_CONF = """\
worker_processes {workers};
{user}
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; multi_accept on; }}
http {{
    {access_log}
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    upstream worker {{
        {servers}
        keepalive 256;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://worker;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def start_nginx(procs: Processes, tmp: Path, sim_port: int, quiet: bool,
                args: argparse.Namespace) -> tuple[Proc, int]:
    return start_nginx_on(procs, tmp, [sim_port], quiet, args.proxy_core)


def start_nginx_on(procs: Processes, tmp: Path, sim_ports: list[int], quiet: bool,
                   cores: int | str, workers: int = 1) -> tuple[Proc, int]:
    """nginx with `workers` worker processes on `cores`, proxying to every port of
    `sim_ports` (round robin)."""
    port = free_port()
    ndir = tmp / f"nginx-{port}"
    ndir.mkdir()
    conf = ndir / "nginx.conf"
    access = "access_log off;" if quiet else f"access_log {ndir}/access.log;"
    user = "user root;" if os.geteuid() == 0 else ""
    servers = " ".join(f"server 127.0.0.1:{p};" for p in sim_ports)
    conf.write_text(NGINX_CONF.format(tmp=ndir, servers=servers, port=port, workers=workers,
                                      access_log=access, user=user))
    # -g 'daemon off;' is in the file itself (nginx refuses it twice)
    proc = procs.start("nginx", ["nginx", "-c", str(conf), "-p", str(ndir)], cores,
                       ndir / "stdout.log")
    wait_healthy(proc, f"http://127.0.0.1:{port}/health")
    proc.extra_pids = [p for p in process_tree(proc.pid) if p != proc.pid]
    return proc, port


def start_python_floor(procs: Processes, tmp: Path, mode: str, sim_port: int,
                       args: argparse.Namespace) -> tuple[Proc, int]:
    port = free_port()
    proc = procs.start("python-floor", [PY, str(HERE / "python_floor.py"), "--port", str(port),
                                        "--upstream-port", str(sim_port), "--mode", mode],
                       args.proxy_core, tmp / f"python-floor-{mode}-{port}.log")
    wait_healthy(proc, f"http://127.0.0.1:{port}/health")
    return proc, port


# ---------------------------------------------------------------- one measurement


def loadgen_command(port: int, case: dict[str, Any], clients: int,
                    args: argparse.Namespace) -> list[str]:
    """bench/loadgen.py for `case` with `clients` on `port`, as `args` time it (bench/scaling.py
    too); the caller adds the processes it watches."""
    cmd = [PY, str(HERE / "loadgen.py"), "--port", str(port), "--concurrency", str(clients),
           "--warmup", str(args.warmup), "--duration", str(args.duration),
           "--max-tokens", str(args.tokens), "--client", getattr(args, "loadgen", "httptools")]
    if case["stream"]:
        cmd.append("--stream")
    if case["itl_ms"] or case["ttft_ms"]:  # paced: spread arrivals over one request's time
        cmd += ["--stagger", f"{(case['ttft_ms'] + case['itl_ms'] * args.tokens) / 1000:g}"]
    return cmd


def measure(port: int, case: dict[str, Any], watch: list[int], sim_pid: int,
            args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    cmd = loadgen_command(port, case, clients(case, args), args) + ["--also-pid", str(sim_pid)]
    for pid in watch:
        cmd += ["--watch-pid", str(pid)]
    limit = args.warmup + args.duration + 60
    with tempfile.TemporaryFile(dir=tmp) as err:
        proc = subprocess.Popen(pinned(cmd, args.load_core), stdout=subprocess.PIPE, stderr=err,
                                cwd=ROOT)
        try:
            out, _ = proc.communicate(timeout=limit)
        except BaseException:
            proc.kill()
            proc.wait(5)
            raise
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"load generator failed ({proc.returncode}):\n"
                               f"{err.read().decode(errors='replace')[-3000:]}")
    result: dict[str, Any] = json.loads(out)
    window = result["window_s"]
    result["load_core_util"] = (result["loadgen_cpu_s"] + (result["also_cpu_s"] or 0)) / window
    result["loadgen_util"] = result["loadgen_cpu_s"] / window
    result["sim_util"] = (result["also_cpu_s"] or 0) / window
    busy = result.get("core_busy_s") or {}
    proxy_cpu = result["proxy_cpu_s"] or 0.0
    # what else ran on the two cores (other people's processes on a shared machine; on the
    # load core also this script), not counting irq/softirq time, which is our own traffic's
    def task_busy(core: int, default: float) -> float:
        return float(busy.get(f"cpu{core}", default)) - float(busy.get(f"cpu{core}_softirq", 0.0))
    result["proxy_core_other"] = (task_busy(args.proxy_core, proxy_cpu) - proxy_cpu) / window
    result["load_core_busy"] = task_busy(args.load_core, 0.0) / window
    if result["proxy_cpu_s"] is not None:
        cpu_us = result["proxy_cpu_s"] * 1e6
        result["proxy_util"] = result["proxy_cpu_s"] / window
        result["proxy_sys_share"] = (result["proxy_sys_s"] / result["proxy_cpu_s"]
                                     if result["proxy_cpu_s"] else None)
        result["cpu_us_per_chunk"] = cpu_us / result["chunks"] if result["chunks"] else None
        result["cpu_us_per_request"] = cpu_us / result["requests"] if result["requests"] else None
        # what one core would carry if this CPU cost per request held at 100% of the core
        result["capacity_req_per_s"] = (1e6 / result["cpu_us_per_request"]
                                        if result["cpu_us_per_request"] else None)
    return result


def run_py_spy(pid: int, seconds: float, out: Path, core: int,
               native: bool = False) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    if not Path(exe).exists():
        print("py-spy not found; no profile", file=sys.stderr)
        return None
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
           "--rate", "200", "--format", "raw", "--output", str(out)]
    # --native needs to pause the process to unwind its C stacks; without it, py-spy reads
    # the Python stacks without stopping the gateway
    cmd.append("--native" if native else "--nonblocking")
    return subprocess.Popen(pinned(cmd, core), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------- report


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "–" if v is None else format(v, spec)


def proxy_core(r: dict[str, Any]) -> str:
    """The proxy's share of its core, and the kernel's (syscall) part of that."""
    if r.get("proxy_util") is None:
        return "–"
    out = f"{r['proxy_util'] * 100:.0f}%"
    if r.get("proxy_sys_share") is not None:
        out += f" (sys {r['proxy_sys_share'] * 100:.0f}%)"
    return out


def table(case_name: str, rows: list[tuple[str, dict[str, Any]]], args: argparse.Namespace) -> str:
    direct = next((r for name, r in rows if name == "direct"), None)
    nginx = {name.split("nginx", 1)[1]: r for name, r in rows if name.startswith("nginx")}
    lines = [
        (f"### {case_name}  (N={clients(CASES[case_name], args)}, {args.duration:g} s"
         + (f", best of {args.repeat} by least interference" if args.repeat > 1 else "")
         + f", {args.tokens} tokens, itl {CASES[case_name]['itl_ms']:g} ms)"),
        "",
        ("| target | req/s | chunks/s | TTFT p50 / p99 (ms) | added TTFT p50 / p99 (ms) "
         "| throughput / direct | proxy CPU µs/chunk | proxy CPU µs/req | CPU / nginx "
         "| proxy core (kernel share) | 1-core capacity req/s | load core (sim + loadgen) "
         "| errors |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        t = r["ttft_ms"]
        added = "–"
        ratio = "–"
        if direct is not None and name != "direct":
            d = direct["ttft_ms"]
            if None not in (t["p50"], t["p99"], d["p50"], d["p99"]):
                added = f"{t['p50'] - d['p50']:+.2f} / {t['p99'] - d['p99']:+.2f}"
            if direct["req_per_s"]:
                ratio = f"{r['req_per_s'] / direct['req_per_s']:.2f}"
        vs_nginx = "–"
        if not name.startswith("nginx") and name != "direct":
            ng = nginx.get("-quiet" if "quiet" in name else "") or next(iter(nginx.values()), None)
            if ng and ng.get("cpu_us_per_chunk") and r.get("cpu_us_per_chunk"):
                vs_nginx = f"{r['cpu_us_per_chunk'] / ng['cpu_us_per_chunk']:.1f}×"
        lines.append(
            f"| {name} | {r['req_per_s']:.0f} | {r['chunks_per_s']:.0f} "
            f"| {fmt(t['p50'], '.2f')} / {fmt(t['p99'], '.2f')} | {added} | {ratio} "
            f"| {fmt(r.get('cpu_us_per_chunk'))} | {fmt(r.get('cpu_us_per_request'))} "
            f"| {vs_nginx} | {proxy_core(r)} "
            f"| {fmt(r.get('capacity_req_per_s'), '.0f')} "
            f"| {r['load_core_util'] * 100:.0f}% ({r['sim_util'] * 100:.0f} + "
            f"{r['loadgen_util'] * 100:.0f}) | {r['errors']} |")
    notes = []
    if any(r["load_core_util"] > 0.9 for _, r in rows):
        notes.append("load core ≥ 90% busy in some rows: there the simulator/load generator, "
                     "not the proxy, may limit throughput (CPU per chunk is still valid).")
    busy_other = [f"{name} {r['proxy_core_other'] * 100:.0f}%" for name, r in rows
                  if name != "direct" and r.get("proxy_core_other", 0) > 0.1]
    if busy_other:
        notes.append("the proxy core also ran other processes (a shared machine) during: "
                     + ", ".join(busy_other)
                     + "; those rows' throughput and latency are pessimistic.")
    load_other = [f"{name} {(r['load_core_busy'] - r['load_core_util']) * 100:.0f}%"
                  for name, r in rows if r["load_core_busy"] - r["load_core_util"] > 0.15]
    if load_other:
        notes.append("the load core also ran other work (this script, py-spy, other "
                     "processes) during: " + ", ".join(load_other) + ".")
    if not nginx and "nginx" in args.targets and shutil.which("nginx") is None:
        notes.append("nginx not on PATH: no floor rows.")
    errs = [f"{name}: {r['error_samples']}" for name, r in rows if r["errors"]]
    if errs:
        notes.append("errors: " + "; ".join(errs))
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def summary_table(report: dict[str, Any], args: argparse.Namespace) -> str:
    """The README's performance table: per case, nginx and the gateway side by side."""
    lines = ["| case | clients | target | req/s | added TTFT p50 / p99 (ms) | CPU µs/chunk "
             "| CPU µs/request | gateway / nginx |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for name, data in report["cases"].items():
        rows = data["rows"]
        direct, ng = rows.get("direct"), rows.get("nginx")
        per = "cpu_us_per_chunk" if data["settings"]["stream"] else "cpu_us_per_request"
        for label, r in rows.items():
            if label == "direct":
                continue
            added = "–"
            if direct and None not in (r["ttft_ms"]["p50"], direct["ttft_ms"]["p50"]):
                added = (f"{r['ttft_ms']['p50'] - direct['ttft_ms']['p50']:+.2f} / "
                         f"{r['ttft_ms']['p99'] - direct['ttft_ms']['p99']:+.2f}")
            ratio = "–"
            if not label.startswith(("direct", "nginx")) and ng and ng.get(per) and r.get(per):
                ratio = f"{r[per] / ng[per]:.2f}×"
            chunk = fmt(r.get("cpu_us_per_chunk")) if data["settings"]["stream"] else "–"
            lines.append(f"| {name} | {clients(data['settings'], args)} | {label} "
                         f"| {r['req_per_s']:,.0f} | {added} | {chunk} "
                         f"| {fmt(r.get('cpu_us_per_request'))} | {ratio} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", "-n", type=int, default=32,
                   help="clients, where the case sets none")
    p.add_argument("--upstream", choices=["fast", "simulator"], default="fast",
                   help="the worker: static vLLM-shaped bytes (bench/fast_upstream.py) or the "
                        "simulator")
    p.add_argument("--duration", "-d", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before each window")
    p.add_argument("--tokens", type=int, default=64, help="tokens per answer")
    p.add_argument("--cases", default="stream-saturated,stream-paced,whole-saturated,whole-one-client",
                   help=f"comma list of {', '.join(CASES)}")
    p.add_argument("--targets", default="direct,nginx,python-floor,gateway",
                   help="comma list of direct, nginx, python-floor (bench/python_floor.py: "
                        "a bare asyncio relay, bytes and json), gateway")
    p.add_argument("--client", default="http1",
                   help="the gateway's upstream client(s): comma list of http1, aiohttp, httpx")
    p.add_argument("--server", default="native",
                   help="the gateway's HTTP server(s): comma list of native (its own, what "
                        "`gateway serve` runs), uvicorn, granian")
    p.add_argument("--logs", choices=["on", "off", "both"], default="on",
                   help="per-request log lines of the proxies (gateway JSON line, nginx "
                        "access log): on (production), off, or both")
    p.add_argument("--baseline-server", default="uvicorn", choices=("native", "uvicorn", "granian"),
                   help="the server the baseline checkout runs (its run_gateway.py must know it)")
    p.add_argument("--baseline", metavar="DIR",
                   help="also measure the gateway of another checkout (e.g. a worktree of "
                        "main), with its own defaults, in the same run")
    p.add_argument("--compiled", action="store_true",
                   help="also measure this tree built with setup.py's compiled modules "
                        "(as `pip install .` builds it with a C compiler), built first in a "
                        "temporary copy: the row gateway-compiled")
    p.add_argument("--loadgen", choices=["httptools", "aiohttp"], default="httptools",
                   help="load generator client (see bench/loadgen.py)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per target, interleaved; the row shows the run least disturbed "
                        "by other work on the machine (all runs are in the JSON)")
    p.add_argument("--wait-quiet", type=float, default=10.0,
                   help="before each run, wait up to this many seconds for both cores to be "
                        "idle (a shared machine); 0: do not wait")
    p.add_argument("--proxy-core", type=int, default=0)
    p.add_argument("--load-core", type=int, default=1)
    p.add_argument("--py-spy", action="store_true",
                   help="profile each gateway run with py-spy (affects its numbers; raw "
                        "stacks and a summary go to bench/results/)")
    p.add_argument("--native", action="store_true",
                   help="with --py-spy: C frames too (pauses the gateway at every sample)")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    args.clients = [c.strip() for c in args.client.split(",") if c.strip()]
    args.servers = [s.strip() for s in args.server.split(",") if s.strip()]
    for c in args.cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}")
    for c in args.clients:
        if c not in ("http1", "aiohttp", "httpx"):
            p.error(f"unknown client {c!r}")
    for s in args.servers:
        if s not in ("native", "uvicorn", "granian"):
            p.error(f"unknown server {s!r}")
    if "granian" in args.servers:
        import importlib.util
        if importlib.util.find_spec("granian") is None:
            p.error("--server granian: granian is not installed (pip install granian)")
    return args


def cpu_model() -> str:
    """The processor's name (/proc/cpuinfo), to name the machine beside its figures."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def source_state() -> dict[str, Any]:
    """The commit measured and whether the tree had local changes (read-only git calls)."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=False,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    changed = [line[3:] for line in git("status", "--porcelain").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "changed_files": len(changed),
            "changed_runtime_files": [f for f in changed
                                      if f.startswith(("gateway/", "adapters/", "schemas/"))]}


class Spy:
    """py-spy over the measured window only (started after the warm-up), on the load core."""

    def __init__(self, pid: int, args: argparse.Namespace, raw: Path):
        import threading

        self.proc: subprocess.Popen[bytes] | None = None
        self.cancelled = False
        self._timer = threading.Timer(args.warmup, self._start, (pid, args, raw))
        self._timer.daemon = True
        self._timer.start()

    def _start(self, pid: int, args: argparse.Namespace, raw: Path) -> None:
        if not self.cancelled:
            self.proc = run_py_spy(pid, args.duration, raw, args.load_core, args.native)

    def finish(self) -> None:
        self.cancelled = True
        self._timer.join(5)
        if self.proc is not None:
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def interference(r: dict[str, Any]) -> float:
    """Share of the two cores that something other than the benchmark's processes used."""
    proxy_other = float(r.get("proxy_core_other", 0.0))
    load_other = float(r["load_core_busy"]) - float(r["load_core_util"])
    return max(0.0, proxy_other) + max(0.0, load_other)


def cleanest_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repetition that other work on the machine disturbed least."""
    best: dict[str, Any] = min(runs, key=interference)
    chosen = dict(best)
    if len(runs) > 1:
        chosen["repeats"] = [{k: r.get(k) for k in ("req_per_s", "chunks_per_s", "ttft_ms",
                                                     "cpu_us_per_chunk", "cpu_us_per_request",
                                                     "proxy_core_other", "load_core_busy",
                                                     "load_core_util")} for r in runs]
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cores = os.sched_getaffinity(0)
    if shutil.which("taskset") is None:
        print("taskset (util-linux) is needed to pin the processes", file=sys.stderr)
        return 2
    if {args.proxy_core, args.load_core} - cores:
        print(f"cores {args.proxy_core}/{args.load_core} not available (have {sorted(cores)})",
              file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {args.load_core})  # keep this script off the proxy's core

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored

    logs = {"on": [False], "off": [True], "both": [False, True]}[args.logs]
    targets: list[dict[str, Any]] = []
    if "direct" in args.targets:
        targets.append({"label": "direct", "kind": "direct"})
    if "nginx" in args.targets:
        if shutil.which("nginx") is None:
            print("note: nginx is not on PATH; the nginx floor rows are skipped", file=sys.stderr)
        else:
            targets += [{"label": "nginx" + ("-quiet" if q else ""), "kind": "nginx", "quiet": q}
                        for q in logs]
    if "python-floor" in args.targets:  # what any asyncio relay pays: see python_floor.py
        targets += [{"label": f"python-floor-{m}", "kind": "python-floor", "mode": m}
                    for m in ("bytes", "json")]
    if "gateway" in args.targets:
        for server, client, quiet in itertools.product(args.servers, args.clients, logs):
            targets.append({"label": f"gateway-{server}-{client}" + ("-quiet" if quiet else ""),
                            "kind": "gateway", "server": server, "client": client,
                            "quiet": quiet})
        if args.compiled:  # the same tree, its hot modules compiled (setup.py)
            targets.append({"label": "gateway-compiled", "kind": "gateway", "server": "native",
                            "quiet": False, "root": "", "compile": True})
        if args.baseline:  # the same measurement of another checkout, in the same run
            targets.append({"label": "gateway-baseline", "kind": "gateway",
                            "server": args.baseline_server,
                            "quiet": False, "root": args.baseline})

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report: dict[str, Any] = {
        "command": " ".join(["python", "bench/bench.py", *(argv or sys.argv[1:])]),
        "args": dict(vars(args)),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "load": os.getloadavg(),
                    "processor": cpu_model()},
        "source": source_state(),
        "cases": {},
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp_s, Processes() as procs:
        tmp = Path(tmp_s)
        for t in targets:
            if t.get("compile"):
                t["root"] = str(compiled_copy(tmp / "compiled"))

        def run_target(t: dict[str, Any], case_name: str, case: dict[str, Any], sim: Proc,
                       sim_port: int, rep: int) -> dict[str, Any]:
            print(f"[{case_name}] {t['label']}" + (f" #{rep + 1}" if args.repeat > 1 else ""),
                  file=sys.stderr, flush=True)
            if args.wait_quiet > 0:
                waited = wait_quiet([args.proxy_core, args.load_core], args.wait_quiet)
                if waited > 1.5:
                    print(f"  waited {waited:.0f} s for the cores to be idle", file=sys.stderr)
            if t["kind"] == "direct":
                return measure(sim_port, case, [], sim.pid, args, tmp)
            if t["kind"] == "nginx":
                proxy, port = start_nginx(procs, tmp, sim_port, t["quiet"], args)
            elif t["kind"] == "python-floor":
                proxy, port = start_python_floor(procs, tmp, t["mode"], sim_port, args)
            else:
                proxy, port = start_gateway(procs, tmp, t, sim_port, args)
            spy = None
            try:
                if args.py_spy and t["kind"] == "gateway":
                    spy = Spy(proxy.pid, args,
                              out_dir / f"{stamp}-{case_name}-{t['label']}-{rep + 1}.pyspy.txt")
                return measure(port, case, process_tree(proxy.pid), sim.pid, args, tmp)
            finally:
                if spy is not None:
                    spy.finish()
                procs.stop(proxy)

        try:
            for case_name in args.cases:
                case = CASES[case_name]
                sim_port = free_port()
                sim = start_simulator(procs, tmp, case, args, sim_port)
                runs: dict[str, list[dict[str, Any]]] = {t["label"]: [] for t in targets}
                try:
                    for rep in range(args.repeat):  # interleaved: drift hits every target
                        for t in targets:
                            runs[t["label"]].append(
                                run_target(t, case_name, case, sim, sim_port, rep))
                finally:
                    procs.stop(sim)
                rows = [(label, cleanest_run(rs)) for label, rs in runs.items()]
                report["cases"][case_name] = {"settings": case, "rows": dict(rows)}
                print(table(case_name, rows, args) + "\n", flush=True)
            print(summary_table(report, args), flush=True)
        except KeyboardInterrupt:
            print("interrupted; stopping every process started", file=sys.stderr)
            return 130
        finally:
            report["elapsed_s"] = time.monotonic() - started
            path = out_dir / f"{stamp}.json"
            path.write_text(json.dumps(report, indent=2))
            print(f"results: {path} ({report['elapsed_s']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
