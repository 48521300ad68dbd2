"""A copy of this tree with setup.py's `COMPILED` modules built in place, each C extension
beside its .py file (so the copy imports them first, on PYTHONPATH): what
tests/integration/test_compiled_build.py runs tests against and `bench/bench.py --compiled`
measures. Needs mypy (CI's test tools have it) and a C compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from build_support.compile_choice import c_compiler

__all__ = ["build", "c_compiler"]

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["schemas", "adapters", "gateway", "simulator", "tests", "bench", "build_support", "deploy",
           "setup.py", "pyproject.toml", "README.md"]


def build(dest: Path, opt_level: str = "3",
          separate: bool = False) -> subprocess.CompletedProcess[str]:
    """Copy the sources to `dest` and compile there; the build's output, for its errors.
    `opt_level` "0" builds fastest (tests check behaviour, not speed); the image builds "3".
    `separate`: a library per module, compiled on every core (a third of the time at -O0);
    the image builds them as one (setup.py)."""
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "results"))
        else:
            shutil.copy2(src, dest / name)
    env = {**os.environ, "GATEWAY_COMPILE": "1", "GATEWAY_COMPILE_OPT": opt_level,
           "GATEWAY_COMPILE_SEPARATE": "1" if separate else ""}
    jobs = ["-j", str(os.cpu_count() or 1)] if separate else []
    return subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", *jobs],
                          cwd=dest, env=env, capture_output=True, text=True, timeout=900)
