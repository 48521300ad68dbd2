"""gateway.processes: a serving process that keeps dying is restarted with a growing delay."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from gateway import admission, config, processes, supervisor


class _Dying:
    """A process that has exited by the time it is started: its sentinel is readable."""

    started = 0

    def __init__(self, **_: Any) -> None:
        self.pid: int | None = None
        self.exitcode: int | None = None

    def start(self) -> None:
        type(self).started += 1
        read, write = os.pipe()
        os.close(write)  # end of file at once: readable
        self.sentinel = read
        self.pid, self.exitcode = 1_000_000 + self.started, 1

    def join(self) -> None:
        os.close(self.sentinel)


class _Context:
    Process = _Dying


def test_the_delay_doubles_to_the_managed_workers_cap() -> None:
    delays = [processes.restart_delay(n) for n in range(1, 9)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert delays[-1] == supervisor.RESTART_MAX_SECONDS and max(delays) == delays[-1]


@pytest.mark.anyio
@pytest.mark.parametrize(("reset_after", "expected"), [(3600.0, [1, 2, 3]), (0.0, [1, 1, 1])])
async def test_deaths_in_a_row_are_counted_and_a_long_run_starts_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reset_after: float,
        expected: list[int]) -> None:
    """Deaths as soon as started count up (1, 2, 3: the delays 1, 2, 4 s); a process that
    lived RESTART_RESET_SECONDS is a first death again."""
    asked: list[int] = []
    stop = asyncio.Event()

    def delay(deaths: int) -> float:
        asked.append(deaths)
        if len(asked) == 3:
            stop.set()
        return 0.0

    _Dying.started = 0
    monkeypatch.setattr(processes.multiprocessing, "get_context", lambda _: _Context)
    monkeypatch.setattr(processes, "restart_delay", delay)
    monkeypatch.setattr(supervisor, "RESTART_RESET_SECONDS", reset_after)
    with socket.socket() as sock:
        kept = processes.ServingProcess(config.Config(), sock, "warning", str(tmp_path),
                                        admission.Slots(str(tmp_path), 1), 0)
        await asyncio.wait_for(kept.keep(stop), 10)
    assert asked == expected and _Dying.started == 3
