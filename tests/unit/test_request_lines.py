"""The per-request log line: structlog's JSON shape (event, level, ISO UTC timestamp, bound
context such as a serving process's pid), written once per event-loop turn."""

from __future__ import annotations

import asyncio
import re

import orjson
import pytest
import structlog

from gateway import observability


class Sink:
    """A text stream whose binary buffer counts its writes."""

    def __init__(self) -> None:
        self.buffer = self
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def flush(self) -> None:
        return None


def test_line_shape_without_a_loop() -> None:
    sink = Sink()
    lines = observability.RequestLines(sink)  # type: ignore[arg-type]
    with structlog.contextvars.bound_contextvars(pid=123):
        lines.add({"request_id": "r1", "status": 200})
    (line,) = sink.writes
    obj = orjson.loads(line)
    assert line.endswith(b"\n") and list(obj)[:2] == ["request_id", "status"]
    assert obj["event"] == "request" and obj["level"] == "info" and obj["pid"] == 123
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", obj["timestamp"])


@pytest.mark.anyio
async def test_lines_of_one_loop_turn_are_one_write() -> None:
    sink = Sink()
    lines = observability.RequestLines(sink)  # type: ignore[arg-type]
    for i in range(3):
        lines.add({"request_id": f"r{i}"})
    assert sink.writes == []  # not on the request's path
    await asyncio.sleep(0)
    (data,) = sink.writes
    assert [orjson.loads(x)["request_id"] for x in data.splitlines()] == ["r0", "r1", "r2"]
