"""The installed distribution's version and build, for --version, /info and the start log line."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata

from gateway import http1


def version() -> str:
    try:
        return importlib.metadata.version("inference-gateway")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def build() -> str:
    """`compiled` where `pip install .` compiled the hot modules (setup.py's `COMPILED`, one
    library: any of them tells), else `pure`: the build falls back quietly where it cannot
    compile, so the operator reads here which one runs."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return "compiled" if (http1.__file__ or "").endswith(suffixes) else "pure"


def describe() -> str:
    return f"gateway {version()} ({build()})"
