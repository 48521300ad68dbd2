"""Shared test options: `--update-goldens` rewrites golden files instead of comparing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import leaks


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite golden files from the current output; review the diff")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def no_internal_details_in_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every error answer any test reads through httpx (in-process gateways, gateway
    processes, fakes alike; whole or streamed) holds no worker address, exception class name
    or HTML page (issue 12; tests/leaks.py)."""
    seen = leaks.install(monkeypatch)
    yield
    assert not seen.found, "internal details in error answers:\n" + "\n".join(seen.found)
