"""`pip install .` compiles the hot modules where it can and installs pure Python where it
cannot (build_support/compile_choice.py): no compiler, mypyc refusing, or the compiler failing
leave a working pure install in best effort, fail the build when `GATEWAY_COMPILE=1` asks for
the compiled one, and leave no shim behind without its library."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
from setuptools import Distribution, Extension
from setuptools.errors import CompileError

from build_support import compile_choice

NO_CC = "/nonexistent/cc"


@pytest.mark.parametrize(("value", "mode"), [
    ("", compile_choice.BEST_EFFORT), ("1", compile_choice.REQUIRED),
    ("0", compile_choice.OFF), ("yes", compile_choice.BEST_EFFORT),
])
def test_the_variable_chooses_the_mode(value: str, mode: str) -> None:
    assert compile_choice.mode({"GATEWAY_COMPILE": value}) == mode


def test_an_unset_variable_is_best_effort() -> None:
    assert compile_choice.mode({}) == compile_choice.BEST_EFFORT


@pytest.mark.parametrize(("environ", "compiling"), [
    ({"CC": "/bin/sh"}, True),  # any compiler found on the machine
    ({"CC": NO_CC}, False),
    ({"CC": "/bin/sh", "GATEWAY_COMPILE": "0"}, False),
    ({"CC": NO_CC, "GATEWAY_COMPILE": "1"}, True),  # required: the build fails, not falls back
])
def test_a_wheel_compiles_where_a_compiler_is_and_pure_was_not_asked(
        environ: dict[str, str], compiling: bool) -> None:
    assert compile_choice.compiling(environ) is compiling


@pytest.mark.parametrize(("argv", "builds"), [
    (["setup.py", "bdist_wheel", "--dist-dir", "x"], True),
    (["setup.py", "-q", "build_ext", "--inplace"], True),
    (["setup.py", "egg_info"], False),  # metadata, before the build environment has mypy
    (["setup.py", "editable_wheel", "--dist-dir", "x"], False),  # `pip install -e .`
])
def test_only_a_wheel_or_extension_build_compiles(argv: list[str], builds: bool) -> None:
    assert compile_choice.builds_binaries(argv) is builds


def test_mypyc_is_given_the_modules_and_the_build_settings() -> None:
    calls: list[tuple[list[str], dict[str, Any]]] = []

    def mypycify(modules: list[str], **options: Any) -> list[str]:
        calls.append((modules, options))
        return ["ext"]

    environ = {"CC": "/bin/sh", "GATEWAY_COMPILE_OPT": "0", "GATEWAY_COMPILE_SEPARATE": "1"}
    assert compile_choice.extensions(["gateway/http1.py"], environ, mypycify) == ["ext"]
    assert calls == [(["gateway/http1.py"], {"opt_level": "0", "separate": True})]


def test_without_a_compiler_mypyc_is_not_run_and_the_build_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    def mypycify(modules: list[str], **options: Any) -> list[str]:
        raise AssertionError("mypyc ran with no compiler to build its output")

    assert compile_choice.extensions(["gateway/http1.py"], {"CC": NO_CC}, mypycify) == []
    assert "no C compiler" in capsys.readouterr().err


def refusing_mypycify(modules: list[str], **options: Any) -> list[str]:
    raise SystemExit(1)  # what mypyc does on a type error


def test_mypyc_refusing_is_a_pure_install_in_best_effort(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert compile_choice.extensions(["m.py"], {"CC": "/bin/sh"}, refusing_mypycify) == []
    assert "installing pure Python" in capsys.readouterr().err


def test_mypyc_refusing_fails_the_build_when_compiling_is_required() -> None:
    with pytest.raises(SystemExit):
        compile_choice.extensions(["m.py"], {"CC": "/bin/sh", "GATEWAY_COMPILE": "1"},
                                  refusing_mypycify)


def build_command(tmp_path: Path) -> compile_choice.OptionalBuildExt:
    """OptionalBuildExt over a one-function C extension, built into tmp_path/lib."""
    source = tmp_path / "probe.c"
    source.write_text('#include <Python.h>\nstatic struct PyModuleDef m = '
                      '{PyModuleDef_HEAD_INIT, "probe", NULL, -1, NULL};\n'
                      'PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&m); }\n')
    dist = Distribution({"name": "probe", "script_name": "setup.py",
                         "ext_modules": [Extension("probe", [str(source)])]})
    command = compile_choice.OptionalBuildExt(dist)
    command.build_lib = str(tmp_path / "lib")
    command.build_temp = str(tmp_path / "temp")
    command.ensure_finalized()
    return command


def test_a_failing_compiler_leaves_no_extension_and_no_stale_library(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A library an earlier build left in the build directory goes too: the wheel would
    otherwise pack a shim whose shared library the failed build did not make."""
    command = build_command(tmp_path)
    stale = Path(command.get_ext_fullpath("probe"))
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an earlier build's library")
    os.utime(stale, (1, 1))  # older than the source: the build runs the compiler
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.delenv("GATEWAY_COMPILE", raising=False)
    command.run()
    assert not stale.exists()
    assert command.get_outputs() == []
    assert "the C compiler failed" in capsys.readouterr().err


def test_a_failing_compiler_fails_the_build_when_compiling_is_required(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    command = build_command(tmp_path)
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("GATEWAY_COMPILE", "1")
    with pytest.raises(CompileError):
        command.run()


def test_this_machines_compiler_builds_an_importable_extension_or_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Best effort with the compiler the machine has: a module that imports where there is
    one (CI has gcc), and no extension at all where there is none."""
    monkeypatch.delenv("GATEWAY_COMPILE", raising=False)
    command = build_command(tmp_path)
    command.run()
    if compile_choice.c_compiler() is None:
        assert command.get_outputs() == []
        return
    [built] = command.get_outputs()
    spec = importlib.util.spec_from_file_location("probe", built)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__name__ == "probe"
