"""The compiled build (what `pip install .` makes where there is a C compiler, setup.py):
every module it lists compiles with mypyc, is the one imported, and the compiled gateway
writes the same bytes as the pure one. The goldens (every client protocol's answers and
errors, every worker's request) and the front end x worker matrix run against the compiled
modules, and a compiled gateway answers requests, and relays worker answers, full of odd
values as a pure one does. A compiled module checks its declared types at run time and reads
its own classes' attributes directly, so a build that compiles can still behave otherwise
(bench/RESULTS.md §21b). The gateway image builds this way (deploy/docker/gateway.Dockerfile)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from build_support import compiled_tree
from tests.integration import procs
from tests.integration.odd_requests import odd_requests

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def compiled_modules() -> list[str]:
    """setup.py's COMPILED, read without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED":
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no COMPILED list")


SUSPENDS = (ast.Await, ast.AsyncFor, ast.AsyncWith, ast.Yield, ast.YieldFrom)


def suspensions_while_handling(source: str) -> list[int]:
    """Lines where code may suspend inside an `except` or `finally` block, or leave an
    `async with` other than `asyncio.timeout` (whose exit never waits)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Try):
            blocks = [stmt for h in node.handlers for stmt in h.body] + node.finalbody
            found += [n.lineno for stmt in blocks for n in ast.walk(stmt)
                      if isinstance(n, SUSPENDS)]
        if isinstance(node, ast.AsyncWith):
            found += [node.lineno for item in node.items
                      if ast.unparse(item.context_expr).split("(")[0] != "asyncio.timeout"]
    return sorted(set(found))


def test_the_check_finds_a_suspension_while_handling() -> None:
    source = ("async def f(x):\n    try:\n        await x()\n    except OSError:\n"
              "        await x()\n    finally:\n        await x()\n"
              "    async with asyncio.timeout(1):\n        pass\n"
              "    async with x():\n        pass\n")
    assert suspensions_while_handling(source) == [5, 7, 10]


def test_no_compiled_code_suspends_while_handling_an_exception() -> None:
    """mypyc (2.4) keeps the exception an `except` or `finally` block handles in the thread's
    state, not the coroutine's: a compiled coroutine that waits there leaves its exception to
    every other task meanwhile, and reads back theirs when it resumes. That once ended
    unrelated requests with a stale `UpstreamTimeout` (bench/RESULTS.md §21b). So compiled
    modules keep the exception, leave the block, and then wait (gateway.serving)."""
    found = [f"{module}:{line}" for module in compiled_modules()
             for line in suspensions_while_handling((ROOT / module).read_text())]
    assert found == []


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if compiled_tree.c_compiler() is None:
        pytest.skip("no C compiler on this machine: the compiled build cannot be made here")
    tree = tmp_path_factory.mktemp("compiled")
    # -O0: this checks what compiles and how it behaves, not its speed (the wheel builds -O3).
    # One library for all, as the wheel's: mypyc type-checks a group otherwise than one module
    # a library (a `Final` read from another module of the group once compiled only alone,
    # and `pip install .` fell back to pure Python, quietly)
    done = compiled_tree.build(tree, opt_level="0", separate=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return tree


def test_every_listed_module_is_compiled_and_imported(build: Path) -> None:
    modules = [m.removesuffix(".py").replace("/", ".") for m in compiled_modules()]
    assert "gateway.serving" in modules and "gateway.http_server" in modules
    probe = "; ".join(f"import {m}" for m in modules) + \
        "; print('\\n'.join(m.__file__ for m in (" + ", ".join(modules) + ",)))"
    files = subprocess.run([sys.executable, "-c", probe], cwd=build, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(build)})
    assert files.returncode == 0, files.stderr
    loaded = files.stdout.split()
    assert len(loaded) == len(modules)
    for path in loaded:
        assert path.startswith(str(build)) and path.endswith(".so"), path
    said = subprocess.run([sys.executable, "-m", "gateway", "--version"], cwd=build,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(build)})
    assert said.stdout.strip().endswith("(compiled)"), said.stdout + said.stderr


def test_the_compiled_gateway_writes_the_goldens_and_the_matrix(build: Path) -> None:
    """The same bytes as the pure modules, for every protocol and every worker kind, the HTTP
    server's answers on the wire, and the unit tests' behaviour (the whole suite passed
    against this build: bench/RESULTS.md §22; CI runs these parts, to stay within its time),
    in pytest runs side by side: nothing else of the suite runs meanwhile, and CI has two
    cores."""
    units = sorted(str(f.relative_to(build)) for f in (build / "tests" / "unit").glob("test_*.py"))
    # and the HTTP server's wire tests (malformed, huge, stalled and smuggling requests): the
    # gateways they start run from this tree (cwd, PYTHONPATH), so compiled
    wire = sorted(str(f.relative_to(build))
                  for f in (build / "tests" / "integration").glob("test_http_wire*.py"))
    # the wire tests mostly wait (on the server's timeouts): a third run beside the two halves
    # (test_odd_answers' first case is left to the side-by-side comparison below, which
    # covers it; its retries, continuations and framings run here)
    halves = [wire, units[0::2], ["tests/golden", "tests/matrix", *units[1::2], "--deselect",
                                  "tests/matrix/test_odd_answers.py::"
                                  "test_odd_worker_answers_are_answered_or_failed_in_the_clients_form"]]
    runs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "-x", *half], cwd=build, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PYTHONPATH": str(build),
                                  "PYTEST_ADDOPTS": ""})  # their summaries as CI's own
            for half in halves]
    try:
        outputs = [r.communicate(timeout=600)[0] for r in runs]
    finally:
        for r in runs:
            if r.poll() is None:
                r.kill()
                r.wait(10)
    for r, out in zip(runs, outputs, strict=True):
        assert r.returncode == 0, out[-8000:]
        summary = out.strip().splitlines()[-1]  # e.g. "1071 passed in 40.23s"
        assert " passed" in summary and "failed" not in summary and "error" not in summary


RUN_COMPILED = ("import sys, gateway.serving as m\n"
                "assert m.__file__.endswith('.so'), m.__file__\n"
                "from gateway.cli import main\nsys.exit(main())")


def test_the_compiled_gateway_answers_odd_requests_as_the_pure_one(
        build: Path, tmp_path: Path) -> None:
    """The HTTP surface, side by side: requests with odd values in every protocol's fields
    (wrong types, huge numbers, empty and nested values), some with odd headers or query
    strings, to a pure and a compiled gateway in front of one simulator get the same status
    and media type, and the same bytes for every error, and neither answers 5xx. A compiled module checks its declared types at run time, so an odd
    value the pure build turns into a 4xx could end as an internal error there instead."""
    sim, sim_url = procs.simulator(tmp_path, "--tokens", "4")
    config = tmp_path / "gateway.yaml"
    config.write_text("default_model: demo\nmodels:\n  - {name: demo, backend: vllm, "
                      f"upstreams: ['{sim_url}']}}\n")
    ports = [procs.free_port(), procs.free_port()]
    serve = ["serve", "--config", str(config), "--host", "127.0.0.1", "--port"]
    pure = procs.Proc([sys.executable, "-m", "gateway", *serve, str(ports[0])],
                      tmp_path / "pure.log")
    # -P: the compiled copy on PYTHONPATH, not the source tree the test runs from; the
    # process checks that it serves with the compiled modules before it starts
    compiled = procs.Proc([sys.executable, "-P", "-c", RUN_COMPILED, *serve, str(ports[1])],
                          tmp_path / "compiled.log", {"PYTHONPATH": str(build)})
    try:
        for proc, port in ((pure, ports[0]), (compiled, ports[1])):
            proc.wait_http(f"http://127.0.0.1:{port}/health", timeout=30)
        statuses: set[int] = set()
        with httpx.Client(timeout=30) as client:
            for path, body, headers in odd_requests(seed=17, count=1000):
                pure_answer, compiled_answer = (
                    client.post(f"http://127.0.0.1:{port}{path}", json=body, headers=headers)
                    for port in ports)
                case = f"{path:.200} {headers!r:.200} {body!r:.400}"
                assert pure_answer.status_code == compiled_answer.status_code, case
                assert pure_answer.status_code < 500, case
                assert pure_answer.headers.get("content-type") == \
                    compiled_answer.headers.get("content-type"), case
                if pure_answer.status_code >= 400:
                    assert pure_answer.content == compiled_answer.content, case
                statuses.add(pure_answer.status_code)
        # both kinds of answer were compared, and the headers' refusals
        assert 200 in statuses and {400, 415, 422} <= statuses
    finally:
        for proc in (pure, compiled, sim):
            proc.stop()


RUN_ODD_ANSWERS = ("import runpy, gateway.serving as m\n"
                   "assert m.__file__.endswith('.so'), m.__file__\n"
                   "runpy.run_module('tests.matrix.odd_answers', run_name='__main__')")


def test_the_compiled_gateway_answers_odd_worker_answers_as_the_pure_one(build: Path) -> None:
    """The worker's side, side by side: answers of every worker kind with odd values in them
    (tests/matrix/odd_answers.py), through every client protocol, get the same status and
    bytes from both builds (ids and times aside). The pure build once read a `false` token
    id or choice index as it came where the compiled one, whose `int` takes a bool, wrote 0;
    and took a finish_reason that is no string (as a natural end) where the compiled one
    refused it."""
    seed, count = "23", "1000"
    runs = [subprocess.Popen([sys.executable, "-m", "tests.matrix.odd_answers", seed, count],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE),
            subprocess.Popen([sys.executable, "-P", "-c", RUN_ODD_ANSWERS, seed, count],
                             cwd=build, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(build)})]
    try:
        (pure, pure_err), (compiled, compiled_err) = (r.communicate(timeout=300) for r in runs)
    finally:
        for r in runs:
            if r.poll() is None:
                r.kill()
                r.wait(10)
    assert runs[0].returncode == 0, pure_err[-4000:]
    assert runs[1].returncode == 0, compiled_err[-4000:]
    lines = pure.decode().splitlines(), compiled.decode().splitlines()
    assert len(lines[0]) == len(lines[1]) == int(count)
    differ = [(p[:500], c[:500]) for p, c in zip(*lines, strict=True) if p != c]
    assert differ == []
