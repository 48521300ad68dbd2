"""The garbage collector's young-generation threshold, raised wherever the gateway serves."""

from __future__ import annotations

import gc
import inspect
from pathlib import Path

from gateway import processes

ROOT = Path(__file__).resolve().parents[2]


def test_every_serving_process_and_the_benchmark_collect_young_objects_less_often() -> None:
    """`gateway serve`, each serving process of several, and bench/run_gateway.py (so that
    the benchmark measures what `gateway serve` runs) set the same threshold."""
    before = gc.get_threshold()
    try:
        processes.tune_collector()
        assert gc.get_threshold() == (20_000, 20, 20)
    finally:
        gc.set_threshold(*before)
    for caller in ("gateway/cli.py", "bench/run_gateway.py"):
        assert "processes.tune_collector()" in (ROOT / caller).read_text()
    assert "tune_collector()" in inspect.getsource(processes.run_child)
