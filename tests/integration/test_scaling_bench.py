"""bench/scaling.py, the measurement behind `server.workers`' speed-up: it must start the
product's own `gateway serve --workers N`, load every serving process, and report each N's
requests/s and its ratio to N = 1 from what the load generators counted; a broken layout or
a silent zero would make its table meaningless."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_python_floor import load

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def test_core_lists_read_as_taskset_writes_them() -> None:
    scaling = load_scaling()
    assert scaling.core_list("0-3,8") == [0, 1, 2, 3, 8]
    assert scaling.core_list("5") == [5]


def test_the_default_layout_keeps_proxy_upstreams_and_load_apart() -> None:
    scaling = load_scaling()
    assert scaling.default_layout(list(range(16)), 4) == (
        [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15])  # core 0 left to the kernel
    assert scaling.default_layout(list(range(5)), 2) == ([0, 1], [2, 3], [4])
    assert scaling.default_layout([2, 3, 5, 7, 8, 9], 2) == ([2, 3], [5, 7], [8, 9])
    with pytest.raises(SystemExit, match="needs 5"):
        scaling.default_layout(list(range(4)), 2)


def test_with_hardware_threads_each_proxy_process_has_a_physical_core_to_itself() -> None:
    """16 threads on 8 cores, siblings (i, i + 8) as Linux numbers them on many Intel hosts:
    the proxies' sibling threads stay idle, and physical core 0 is left to the kernel."""
    scaling = load_scaling()
    smt = {c: [c % 8, c % 8 + 8] for c in range(16)}
    proxy, upstream, load = scaling.default_layout(list(range(16)), 2, smt)
    assert proxy == [1, 2]
    busy = [*proxy, *upstream, *load]
    assert len(set(busy)) == len(busy) and not {0, 8, 9, 10} & set(busy)
    assert len(upstream) == 2 and len(load) == 4
    # too few physical cores for that: the plain layout
    small = {c: [c - c % 2, c - c % 2 + 1] for c in range(6)}
    assert scaling.default_layout(list(range(6)), 2, small) == ([1, 2], [3, 4], [5])
    # one thread a core (what many virtual machines show): as without the map
    assert scaling.default_layout(list(range(16)), 4, {c: [c] for c in range(16)}) == \
        scaling.default_layout(list(range(16)), 4)


def test_siblings_read_the_kernels_list(tmp_path: Path) -> None:
    scaling = load_scaling()
    topo = tmp_path / "cpu3" / "topology"
    topo.mkdir(parents=True)
    (topo / "thread_siblings_list").write_text("3,11\n")
    assert scaling.siblings(3, str(tmp_path)) == [3, 11]
    assert scaling.siblings(4, str(tmp_path)) == [4]  # not listed: alone


def test_the_table_relates_each_n_to_n_equal_one() -> None:
    scaling = load_scaling()
    run = {"req_per_s": 1000.0, "proxy_cpu_us_per_request": 100.0, "proxy_cores_busy": 1.0,
           "proxy_sys_share": 0.1,
           "upstream_core_share": 0.1, "load_core_share": 0.2, "latency_ms_p50": 1.0,
           "errors": 0}
    rows = {"gateway-1": [run], "gateway-2": [{**run, "req_per_s": 1900.0},
                                              {**run, "req_per_s": 1700.0}]}
    args = scaling.parse_args(["--workers", "1,2", "--proxy-cores", "0,1",
                               "--upstream-cores", "0", "--load-cores", "1", "--repeat", "2"])
    lines = scaling.table("whole-saturated", rows, args).splitlines()
    assert lines[-2].startswith("| gateway | 1 | 1,000 | 1,000 | 1.00 | 100.0 | 1.00 (10%) |")
    assert lines[-1].startswith("| gateway | 2 | 1,800 | 1,900 / 1,700 | 1.80 |")


def test_a_short_run_serves_from_one_and_two_processes(tmp_path: Path) -> None:
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scaling.py"), "--targets", "gateway",
         "--workers", "1,2", "--proxy-cores", cores, "--upstream-cores", cores,
         "--load-cores", cores, "--clients", "4", "--duration", "0.5", "--warmup", "0.3",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = tmp_path.glob("scaling-*.json")
    rows = json.loads(result.read_text())["rows"]
    assert set(rows) == {"gateway-1", "gateway-2"}
    for label, (run,) in rows.items():
        assert run["req_per_s"] > 0 and run["errors"] == 0, (label, run)
        assert run["clients"] == 4 * int(label[-1])
        assert run["proxy_cores_busy"] > 0  # the whole process tree was watched
    assert "| gateway | 2 |" in proc.stdout


def load_scaling():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "bench"))  # scaling imports bench/bench.py as `bench`
    try:
        return load("scaling")
    finally:
        sys.path.remove(str(ROOT / "bench"))
