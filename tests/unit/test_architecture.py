"""The code's shape, checked on its source: typed per-request state, no task-local state in the
adapters, small modules, no import circle, and the layering schemas <- adapters <- gateway
(STYLE.md sections 1, 3 and 6; issue 14). Imports are read with `ast`, so an import made only
for type checking (`if TYPE_CHECKING:`) or inside a function counts as much as any other."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adapters import registry
from schemas import canonical

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "adapters", "gateway", "simulator")
MAX_LINES = 400


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of our packages (a package is its
    __init__)."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool,
             mods: Mapping[str, Path]) -> set[str]:
    """The modules of ours an import statement in module `name` loads: `from a import b` is
    a.b when that is a module, else a (whose name b is)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & set(mods)
    base = node.module or ""
    if node.level:  # relative: from the module's own package, then up level - 1
        package = name.split(".") if is_package else name.split(".")[:-1]
        anchor = package[:len(package) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    subs = {f"{base}.{alias.name}" for alias in node.names}
    found = subs & set(mods)
    if subs - found and base in mods:
        found.add(base)
    return found


def import_graph(mods: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, wherever the import stands."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges |= _targets(node, name, path.name == "__init__.py", mods)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    assert cycles(import_graph(modules())) == []


def test_the_circle_check_sees_a_circle(tmp_path: Path) -> None:
    """Not vacuous: a circle through a TYPE_CHECKING import and a relative import is found."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg import b\n")
    (pkg / "b.py").write_text("def f() -> None:\n    from . import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg.a import x\n")
    mods = modules(tmp_path, ("pkg",))
    graph = import_graph(mods)
    assert graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def _imports_of(package: str) -> dict[str, set[str]]:
    mods = modules()
    graph = import_graph(mods)
    return {name: edges for name, edges in graph.items() if name.split(".")[0] == package}


def test_schemas_import_nothing_of_ours_but_schemas() -> None:
    found = {name: sorted(e for e in edges if e.split(".")[0] != "schemas")
             for name, edges in _imports_of("schemas").items()}
    assert {k: v for k, v in found.items() if v} == {}


def test_adapters_never_import_the_gateway() -> None:
    found = {name: sorted(e for e in edges if e.split(".")[0] == "gateway")
             for name, edges in _imports_of("adapters").items()}
    assert {k: v for k, v in found.items() if v} == {}


def test_no_module_over_400_lines() -> None:
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_context_variable_in_adapters() -> None:
    """Per-request state lives in the request's translator, not in task-local variables."""
    found = []
    for name, path in modules(ROOT, ("adapters",)).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n == "contextvars" or n == "ContextVar" for n in names):
                    found.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.Attribute) and node.attr == "ContextVar":
                found.append(f"{name}:{node.lineno}")
    assert found == []


def _untyped(cls: type) -> list[str]:
    """Fields of a class annotated `Any` (or a union with `Any` in it): JSON data such as
    `dict[str, Any]` is typed as far as JSON goes, an `Any` field is anyone's state."""
    out = []
    for name, hint in typing.get_type_hints(cls).items():
        members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union,
                                                                       type(int | None)) \
            else (hint,)
        if any(m is Any for m in members):
            out.append(f"{cls.__name__}.{name}")
    return out


def _request_classes() -> list[type]:
    """InferenceRequest and the dataclasses it holds."""
    seen: list[type] = []
    pending: list[type] = [canonical.InferenceRequest]
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.append(cls)
        for hint in typing.get_type_hints(cls).values():
            for t in (hint, *typing.get_args(hint), *(a for arg in typing.get_args(hint)
                                                      for a in typing.get_args(arg))):
                if isinstance(t, type) and dataclasses.is_dataclass(t):
                    pending.append(t)
    return seen


def test_canonical_request_state_is_typed() -> None:
    classes = _request_classes()
    assert canonical.Sampling in classes and canonical.Message in classes
    assert "client_state" not in {f.name for f in dataclasses.fields(canonical.InferenceRequest)}
    assert [f for cls in classes for f in _untyped(cls)] == []


def _translator_classes() -> list[type]:
    out = []
    for name in modules(ROOT, ("adapters",)):
        if name.startswith("adapters.frontends."):
            module = importlib.import_module(name)
            out += [obj for attr, obj in vars(module).items() if attr.endswith("Translator")
                    and isinstance(obj, type) and obj.__module__ == name]
    return out


def test_every_translator_keeps_typed_state() -> None:
    classes = _translator_classes()
    assert len(classes) >= 6  # openai (2), tgi chat, tgi, lmi, elastic (2)
    assert all(dataclasses.is_dataclass(cls) for cls in classes)
    assert [f for cls in classes for f in _untyped(cls)] == []


def test_the_any_check_sees_an_any_field() -> None:
    @dataclasses.dataclass
    class Loose:
        typed: dict[str, Any]
        state: Any = None
        maybe: Any | None = None

    assert _untyped(Loose) == ["Loose.state", "Loose.maybe"]


def _self_writes(fn: ast.FunctionDef) -> list[int]:
    """Lines where a method stores to an attribute of `self` (any assignment form)."""
    return [node.lineno for node in ast.walk(fn)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == "self"]


def test_frontends_keep_no_request_state() -> None:
    """A frontend serves every request of its route at once: no method but `__init__` writes
    on it, and each route's frontend is a class of its own (no per-route functools.partial)."""
    written = []
    for name, path in modules(ROOT, ("adapters",)).items():
        if not name.startswith("adapters.frontends."):
            continue
        for cls in ast.walk(ast.parse(path.read_text())):
            if isinstance(cls, ast.ClassDef) and cls.name.endswith("Frontend"):
                written += [f"{name}.{cls.name}.{fn.name}:{line}" for fn in cls.body
                            if isinstance(fn, ast.FunctionDef) and fn.name != "__init__"
                            for line in _self_writes(fn)]
    assert written == []
    assert all(isinstance(make, type) for _, make in registry.INFERENCE_ROUTES)


def test_the_state_check_sees_a_write() -> None:
    fn = ast.parse("def parse(self, body):\n    self.n += 1\n    x = self.y\n"
                   "    name, self.framing = body\n").body[0]
    assert isinstance(fn, ast.FunctionDef) and _self_writes(fn) == [2, 4]
