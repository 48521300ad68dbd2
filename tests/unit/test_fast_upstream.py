"""bench/fast_upstream.py stays what the benchmark needs: a worker whose bytes our vLLM decoder
reads as a complete answer (the simulator's own bytes, framed as valid HTTP/1.1), streamed and
whole, over a real loopback connection."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from adapters import base
from adapters.backends import vllm
from gateway import http1, upstream
from schemas import canonical
from schemas import events as ev

pytestmark = pytest.mark.anyio
TOKENS = 5


def fast_upstream() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "fast_upstream.py"
    spec = importlib.util.spec_from_file_location("fast_upstream", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_streamed_and_whole_answers_decode_completely() -> None:
    fu = fast_upstream()
    answers = fu.Answers(await fu.simulator_answer(TOKENS, True),
                         await fu.simulator_answer(TOKENS, False))
    assert len(answers.stream_parts) == TOKENS + 1  # one part per token, then usage + [DONE]
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: fu.Conn(answers, 0.0, 0.0), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = http1.Http1Client(2.0)
    req = canonical.InferenceRequest(
        model="demo", messages=[canonical.Message("user", "hi")], stream=True)
    try:
        for stream in (True, False):
            body = b'{"stream":true}' if stream else b'{"stream":false}'
            resp = await client.send(base.UpstreamRequest(
                "POST", url + "/v1/chat/completions", body))
            assert resp.status == 200
            dec = vllm.VllmBackend().decoder(req, streaming=stream)
            events = [e for data in [await resp.read()] for e in dec.feed(data)] + dec.close()
            await resp.aclose()
            text = "".join(e.text for e in events if isinstance(e, ev.TextDelta))
            assert len(text.split()) == TOKENS
            assert any(isinstance(e, ev.Finish) for e in events)
            assert any(isinstance(e, ev.Usage) for e in events)
        assert await upstream.probe(client, url + "/health", 2.0) == 200
    finally:
        await client.aclose()
        server.close()
