"""The per-request log line: structlog's JSON shape (event, level, ISO UTC timestamp, bound
context such as a serving process's pid), written once per event-loop turn."""

from __future__ import annotations

import asyncio
import json
import re
import select
import subprocess
import sys

import orjson
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

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


@pytest.mark.anyio
async def test_a_large_turn_is_written_in_whole_lines_of_at_most_pipe_buf() -> None:
    """POSIX write(): a pipe write of up to PIPE_BUF bytes is never interleaved with other
    processes' writes, a longer one may be; the serving processes of `server.workers` share one
    stderr (a pipe under a container runtime), so each write holds whole lines and, unless one
    line alone is longer, at most PIPE_BUF bytes."""
    sink = Sink()
    lines = observability.RequestLines(sink)  # type: ignore[arg-type]
    for i in range(60):
        lines.add({"request_id": f"r{i}", "upstream_errors": ["x" * 150]})
    lines.add({"request_id": "long", "upstream_errors": ["y" * 2 * select.PIPE_BUF]})
    lines.add({"request_id": "last"})
    await asyncio.sleep(0)
    assert len(sink.writes) > 2
    for data in sink.writes:
        assert data.endswith(b"\n")
        assert len(data) <= select.PIPE_BUF or data.count(b"\n") == 1
    ids = [orjson.loads(x)["request_id"] for x in b"".join(sink.writes).splitlines()]
    assert ids == [f"r{i}" for i in range(60)] + ["long", "last"]


# Run in a process of its own: `configure` sets structlog and logging for good.
ONE_WRITE_PER_LINE = """
import io, json, logging, sys
class Calls(io.TextIOBase):
    def __init__(self): self.calls = []
    def write(self, s): self.calls.append(s); return len(s)
    def flush(self): pass
out, sys.stderr = sys.stdout, Calls()
from gateway import observability
observability.configure("info")
observability.logger().warning("upstream_ejected", model="m", upstream="u", backoff_s=1)
observability.logger().info("ready")
logging.getLogger("asyncio").error("Task exception was never retrieved")
out.write(json.dumps(sys.stderr.calls))
"""


def test_every_log_line_is_one_write() -> None:
    """With `server.workers: 2` both processes write to one stderr: a line written in two
    calls (structlog's PrintLogger prints the line, then its newline) had the other process's
    line land between them, two JSON objects on one line (seen in tests/integration/
    test_churn.py). Every line, structlog's and the standard library's, is one write."""
    done = subprocess.run([sys.executable, "-c", ONE_WRITE_PER_LINE], capture_output=True,
                          text=True, timeout=30, check=True)
    calls = json.loads(done.stdout)
    assert len(calls) == 3
    for call in calls:
        assert call.endswith("\n") and call.count("\n") == 1, calls
        json.loads(call)


@pytest.mark.anyio
async def test_a_stream_continued_elsewhere_names_the_failure_in_its_request_line() -> None:
    """A worker that broke mid-stream and was continued on another (gateway.failover): the
    client saw one stream, but the request's one line says what the worker did (its error
    among `upstream_errors`, at warning, as a retried failure before the first byte is), and
    the `stream_failover` line carries the request's id, so the two can be joined."""
    import httpx
    import respx
    from structlog.testing import capture_logs

    from tests.unit import test_pipeline_respx as harness
    from tests.unit.test_failover_respx import HEAD, REST

    with respx.mock(assert_all_called=True) as r, capture_logs() as logs:
        harness.healthy(r)
        r.post(f"{harness.UP1}/v1/chat/completions").mock(return_value=httpx.Response(
            200, stream=harness.Broken([HEAD])))
        r.post(f"{harness.UP2}/v1/chat/completions").mock(
            return_value=httpx.Response(200, content=REST))
        resp = await harness.call(r, {**harness.CHAT, "stream": True, "max_tokens": 10},
                                  headers={"x-request-id": "rid-failover"})
    assert resp.status_code == 200 and '"error"' not in resp.text
    (line,) = [e for e in logs if e["event"] == "request"]
    assert line["request_id"] == "rid-failover" and line["status"] == 200
    assert line["log_level"] == "warning"
    assert line["failovers"] == 1 and line["attempts"] == 2
    (cut,) = line["upstream_errors"]
    assert cut.startswith(f"{harness.UP1}: ")
    (moved,) = [e for e in logs if e["event"] == "stream_failover"]
    assert moved["request_id"] == "rid-failover" and moved["continued"] is True


def test_a_stream_cut_by_the_shutdown_is_logged_at_warning() -> None:
    """SIGTERM: a stream still running when the drain time is over ends with its protocol's
    in-band error (README: logged with outcome `shutdown`). The client got an error although
    its status was 200, so the line is a warning, as the same refusal before the head (a 503)
    and a failure upstream after it are; not an info line among the successes."""
    from structlog.testing import capture_logs

    from gateway import exchange

    x = exchange.Exchange("rid-shutdown", "/v1/chat/completions", 0.0, status=200,
                          outcome="shutdown", error_type="shutdown",
                          error="the gateway is shutting down; retry the request")
    with capture_logs() as logs:
        observability.log_exchange(x)
    (line,) = logs
    assert (line["request_id"], line["outcome"], line["log_level"]) == (
        "rid-shutdown", "shutdown", "warning")


@given(st.floats(min_value=0, max_value=86_400, allow_nan=False))
def test_durations_are_milliseconds_to_the_microsecond(seconds: float) -> None:
    """`duration_ms` and `ttft_ms` as `round(seconds * 1000, 3)` gives them, but for a
    near-tie (a thousandth of a millisecond apart at most), without `round`'s decimal string."""
    ms = observability._ms(seconds)
    assert ms == round(ms, 3)
    assert abs(ms - round(seconds * 1000, 3)) <= 0.001 + 1e-9 * seconds * 1000


def test_the_timestamp_is_the_clock_reading_in_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """structlog's TimeStamper(fmt="iso", utc=True) form, its microseconds truncated as
    `datetime.fromtimestamp` keeps them; the date part made once a second."""
    lines = observability.RequestLines(Sink())  # type: ignore[arg-type]
    for ns, stamp in ((1_764_180_000_123_456_789, "2025-11-26T18:00:00.123456Z"),
                      (1_764_180_000_999_999_999, "2025-11-26T18:00:00.999999Z"),
                      (1_764_180_001_000_000_999, "2025-11-26T18:00:01.000000Z")):
        monkeypatch.setattr(observability.time, "time_ns", lambda ns=ns: ns)
        assert lines.timestamp() == stamp
