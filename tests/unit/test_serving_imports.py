"""What a serving process imports: none of the libraries it does not serve with.

The gateway serves with its own HTTP client and server (gateway.http1, gateway.http_server);
aiohttp (which builds two TLS contexts on import), httpx, uvicorn and the simulator's server
were imported by every serving process all the same (and Jinja2, which only chat templates
need), and took half of `gateway serve`'s time
to its first answer (1.3 s to 0.67 s; bench/RESULTS.md §28). A process restarted by
`server.workers`, or a pod's new replica, waits that long before it serves."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import adapters
import gateway
import schemas

NOT_SERVING = ("aiohttp", "httpx", "uvicorn", "simulator.server", "starlette.testclient",
               "jinja2")
# the alternative clients, for the benchmark's comparison and the respx-mocked tests
ALTERNATIVES = {"gateway.upstream_clients"}


def _modules() -> list[str]:
    names = []
    for pkg in (gateway, adapters, schemas):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name not in ALTERNATIVES and not info.name.endswith("__main__"):
                names.append(info.name)
    return names


def _imported_after(modules: list[str]) -> list[str]:
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(','.join(n for n in {NOT_SERVING!r} if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    return [n for n in out.stdout.strip().split(",") if n]


def test_no_serving_module_imports_what_it_does_not_serve_with() -> None:
    modules = _modules()
    assert "gateway.app" in modules and "gateway.processes" in modules
    assert _imported_after(modules) == []


def test_the_check_sees_such_an_import() -> None:
    assert _imported_after(["gateway.upstream_clients"]) == ["aiohttp", "httpx"]
