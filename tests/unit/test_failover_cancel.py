"""A client that leaves while a cut stream's continuations are being opened: every attempt's
in-flight count ends and every worker answer already opened is closed (gateway.failover,
Pipeline._continue), so the balancer's load and the worker connections return to rest."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from adapters import base
from gateway import config, pipeline, routing
from schemas import canonical, errors
from schemas import events as ev

pytestmark = pytest.mark.anyio

UP1, UP2 = "http://up1:8000", "http://up2:8000"


def chunk(index: int, content: str, finish: str | None = None) -> bytes:
    return b"data: " + orjson.dumps({
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": index, "delta": {"content": content},
                     "finish_reason": finish}]}) + b"\n\n"


class Answer:
    """A worker's streamed answer: `parts`, then its end or (`broken`) a cut."""

    status = 200

    def __init__(self, parts: list[bytes], broken: bool):
        self.parts, self.broken, self.closed = list(parts), broken, False

    async def read_chunk(self) -> bytes:
        if self.parts:
            return self.parts.pop(0)
        if self.broken:
            raise errors.UpstreamBroken("the worker's answer broke off")
        return b""

    async def read(self) -> bytes:
        return b"".join(self.parts)

    async def aclose(self) -> None:
        self.closed = True


class Workers:
    """UP1 answers two choices and breaks off; on UP2 the continuation of choice 0 answers at
    once and that of choice 1 never starts (a worker still queueing it)."""

    def __init__(self) -> None:
        self.opened: list[Answer] = []
        self.stalled = asyncio.Event()

    async def send(self, req: base.UpstreamRequest) -> Any:
        body = orjson.loads(req.body)
        if not body.get("continue_final_message"):
            answer = Answer([chunk(0, "Hel") + chunk(1, "Wor")], broken=True)
        elif body["messages"][-1]["content"] == "Hel":
            answer = Answer([chunk(0, "lo", "stop"), b"data: [DONE]\n\n"], broken=False)
        else:
            self.stalled.set()
            await asyncio.Event().wait()
        self.opened.append(answer)
        return answer

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        return 200, ""

    async def aclose(self) -> None:
        return None


async def test_leaving_while_continuations_open_ends_every_attempt() -> None:
    cfg = config.Config.model_validate({
        "default_model": "demo",
        "models": [{"name": "demo", "backend": "vllm", "upstreams": [UP1, UP2],
                    "routing": "round_robin"}]})
    route = routing.Router(cfg).resolve("demo")
    workers = Workers()
    flow = pipeline.Pipeline(workers, cfg.server)
    req = canonical.InferenceRequest(
        model="demo", messages=[canonical.Message("user", "hi")], stream=True,
        sampling=canonical.Sampling(n=2, max_tokens=10))
    delivered: list[ev.Event] = []

    def deliver(batch: list[ev.Event]) -> bool:
        delivered.extend(batch)
        return True

    async def drain() -> None:
        return None

    async def client() -> None:
        opened = await flow.open(route, req, "rid", pipeline.Attempt())
        try:
            await flow.stream(opened, deliver, drain)
        finally:
            await opened.close(route.upstreams)

    task = asyncio.create_task(client())
    await asyncio.wait_for(workers.stalled.wait(), 5)
    for _ in range(5):  # choice 0's continuation has its first events by now
        await asyncio.sleep(0)
    assert len(workers.opened) == 2  # the cut answer, and choice 0's continuation
    task.cancel()  # the client leaves
    with pytest.raises(asyncio.CancelledError):
        await task
    loads = {url: h.in_flight for url, h in route.upstreams.health.items()}
    assert loads == {UP1: 0, UP2: 0}
    assert all(a.closed for a in workers.opened)
