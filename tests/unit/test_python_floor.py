"""bench/python_floor.py relays what the benchmark measures it relaying: the fast upstream's
answers, streamed and whole, reach the client complete (bytes mode unchanged, json mode with
each event re-encoded), over real loopback connections; else its floor numbers mean nothing."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType

import orjson
import pytest

from adapters import base
from gateway import http1, upstream

pytestmark = pytest.mark.anyio
TOKENS = 5
BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e]


@pytest.mark.parametrize("mode", ["bytes", "json"])
async def test_the_floor_relays_streams_and_whole_answers_complete(mode: str) -> None:
    fu, floor = load("fast_upstream"), load("python_floor")
    answers = fu.Answers(await fu.simulator_answer(TOKENS, True),
                         await fu.simulator_answer(TOKENS, False))
    loop = asyncio.get_running_loop()
    worker = await loop.create_server(lambda: fu.Conn(answers, 0.0, 0.0), "127.0.0.1", 0)
    worker_port = worker.sockets[0].getsockname()[1]
    relay = await loop.create_server(lambda: floor.Client(worker_port, mode == "json"),
                                     "127.0.0.1", 0)
    url = f"http://127.0.0.1:{relay.sockets[0].getsockname()[1]}"
    client = http1.Http1Client(2.0)
    try:
        for _ in range(2):  # the second request reuses both keep-alive connections
            resp = await client.send(base.UpstreamRequest(
                "POST", url + "/v1/chat/completions", b'{"stream":true}'))
            assert resp.status == 200
            streamed = await asyncio.wait_for(resp.read(), 5)
            await resp.aclose()
            sent = _body(b"".join(answers.stream_parts))
            if mode == "bytes":
                assert streamed == sent
            got, want = events(streamed), events(sent)
            assert len(got) == len(want) > TOKENS and got[-1] == b"data: [DONE]"
            assert [orjson.loads(e[6:]) for e in got[:-1]] == \
                [orjson.loads(e[6:]) for e in want[:-1]]

            resp = await client.send(base.UpstreamRequest(
                "POST", url + "/v1/chat/completions", b'{"stream":false}'))
            whole = await asyncio.wait_for(resp.read(), 5)
            await resp.aclose()
            assert resp.status == 200
            assert orjson.loads(whole) == orjson.loads(_body(answers.whole))
        assert await upstream.probe(client, url + "/health", 2.0) == 200
    finally:
        await client.aclose()
        relay.close()
        worker.close()


def _body(framed: bytes) -> bytes:
    """The body of a framed HTTP/1.1 response: after the head, de-chunked when chunked."""
    head, _, rest = framed.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return rest
    out = []
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2:]
    return b"".join(out)
