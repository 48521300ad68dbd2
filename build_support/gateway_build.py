"""The package's PEP 517 backend: setuptools', plus what compiling needs when a wheel compiles.

A wheel compiles the hot modules (setup.py's `COMPILED`) with mypyc where it can
(compile_choice.py). mypyc type-checks them as `mypy` does in CI, so the isolated build
environment then needs mypy and the packages whose types the modules use (the project's own
dependencies). A pure build (`GATEWAY_COMPILE=0`, no C compiler, an editable install) is
setuptools' backend unchanged.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import compile_choice  # beside this module, on the backend's path (pyproject.toml)
from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - the hooks this module does not change

ROOT = Path(__file__).resolve().parents[1]


def _compile_requires() -> list[str]:
    """mypy (mypyc), the type stubs CI's mypy uses, and the packages the modules import
    (the dependencies and the `otel` extra: mypy follows every import, as in CI)."""
    if not compile_choice.compiling():
        return []
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    tools = [r for r in extras["test"] if r.startswith(("mypy", "types-"))]
    return [*tools, *project["dependencies"], *extras["otel"]]


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return [*_setuptools.get_requires_for_build_wheel(config_settings), *_compile_requires()]
