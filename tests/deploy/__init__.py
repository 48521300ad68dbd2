"""Tests of deploy/: images (hadolint), Kubernetes manifests (kustomize, schemas), configs.

The linters come as wheels in the `test` extra (pyproject.toml), so these tests need neither
network nor docker nor a cluster, and fail rather than skip when a tool is missing.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def tool(name: str) -> str:
    """A test tool's executable: beside this interpreter (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"`{name}` not found: pip install '.[test]' provides it")
    return found
