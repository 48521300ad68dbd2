"""The installed distribution's version, for --version, /info and the start log line."""

from __future__ import annotations

import importlib.metadata


def version() -> str:
    try:
        return importlib.metadata.version("inference-gateway")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
