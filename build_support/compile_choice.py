"""Whether `pip install .` compiles the hot modules, and the pure-Python install when it cannot.

A wheel (`pip install .`) compiles setup.py's `COMPILED` modules with mypyc where it can: the
build that meets the speed targets (README, Performance). `GATEWAY_COMPILE` chooses:
unset, best effort (a machine with no C compiler, or on which mypyc or the compiler fails,
gets the same modules as pure Python, with a warning in the build's output); `1`, required
(the gateway image: a failure fails the build); `0`, pure Python. Editable installs are
always pure: a compiled module beside its .py would shadow every later edit of it.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

REQUIRED, BEST_EFFORT, OFF = "required", "best effort", "off"
# what a compiler that is missing, or fails on the generated C, raises from build_ext
BUILD_FAILURES = (CCompilerError, CompileError, ExecError, LinkError, PlatformError, OSError)


def mode(environ: Mapping[str, str] = os.environ) -> str:
    return {"1": REQUIRED, "0": OFF}.get(environ.get("GATEWAY_COMPILE", ""), BEST_EFFORT)


def c_compiler(environ: Mapping[str, str] = os.environ) -> str | None:
    """The compiler setuptools would call, if this machine has it."""
    cc = environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shutil.which(cc.split()[0])


def compiling(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a wheel built now is to be compiled (and its build needs mypy)."""
    chosen = mode(environ)
    return chosen == REQUIRED or (chosen == BEST_EFFORT and c_compiler(environ) is not None)


def builds_binaries(argv: Sequence[str]) -> bool:
    """setup.py run to build a wheel or extensions, not for metadata (`egg_info`, run before
    the build environment has mypy) nor an editable install (`editable_wheel`)."""
    return bool({"bdist_wheel", "build_ext"} & set(argv))


def warn(message: str) -> None:
    print(f"inference-gateway: {message}; installing pure Python", file=sys.stderr)


def extensions(modules: list[str], environ: Mapping[str, str] = os.environ,
               mypycify: Callable[..., list[Any]] | None = None) -> list[Any]:
    """mypyc's extensions for `modules`, or none where this build is not to compile or mypyc
    refuses (best effort only: required, its failure is the build's)."""
    if not compiling(environ):
        if mode(environ) == BEST_EFFORT:
            warn("no C compiler on this machine to compile the hot modules with")
        return []
    try:
        if mypycify is None:
            from mypyc import build as mypyc_build
            mypycify = mypyc_build.mypycify
        # GATEWAY_COMPILE_SEPARATE=1: a shared library per module, which `build_ext -j N`
        # compiles side by side (the tests' quick build); else one for all, whose calls
        # between modules are direct (what a wheel ships)
        return mypycify(modules, opt_level=environ.get("GATEWAY_COMPILE_OPT", "3"),
                        separate=environ.get("GATEWAY_COMPILE_SEPARATE", "") == "1")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - mypyc exits on a type error
        if mode(environ) == REQUIRED:
            raise
        warn(f"mypyc could not compile the hot modules ({exc!r})")
        return []


class OptionalBuildExt(build_ext):
    """build_ext that, in best effort, leaves no extension behind when any fails to build:
    mypyc's modules are shims over one shared library, and a shim without it would fail at
    import. The .py files are in the wheel either way."""

    def run(self) -> None:
        try:
            super().run()
        except BUILD_FAILURES as exc:
            if mode() == REQUIRED:
                raise
            warn(f"the C compiler failed on the hot modules ({exc})")
            for ext in self.extensions:
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            self.extensions = []  # what get_outputs() reports to the wheel's record
