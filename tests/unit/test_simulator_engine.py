"""The simulator's capacity model: batch limit and queue, batch-dependent pace, prefix cache,
and the vLLM gauges it publishes on /metrics."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from gateway import health
from simulator import SimulatorSettings, build_app, engine, resume, tokens


def test_requests_past_the_batch_limit_wait_in_order_and_are_counted() -> None:
    async def go() -> list[str]:
        e = engine.Engine(SimulatorSettings(max_batch=1))
        order: list[str] = []

        async def job(name: str) -> None:
            async with e.slot():
                order.append(name)
                assert e.running == 1
                await asyncio.sleep(0.01)

        tasks = [asyncio.ensure_future(job(n)) for n in "abc"]
        await asyncio.sleep(0.001)
        assert (e.running, e.waiting) == (1, 2)
        assert health.gauge_sum(e.metrics().decode(), ("vllm:num_requests_waiting",)) == 2.0
        await asyncio.gather(*tasks)
        assert (e.running, e.waiting) == (0, 0)
        return order

    assert asyncio.run(go()) == ["a", "b", "c"]


def test_per_token_time_grows_with_the_batch() -> None:
    e = engine.Engine(SimulatorSettings(batch_slowdown=0.5))
    e.running = 1
    assert e.step_factor() == 1.0
    e.running = 3
    assert e.step_factor() == 2.0


def test_prefix_cache_counts_leading_blocks_only_and_evicts_lru() -> None:
    e = engine.Engine(SimulatorSettings(prefix_cache_blocks=4, block_tokens=2,
                                        prefill_ms_per_token=1.0))
    a = [1, 2, 3, 4, 5, 6]
    assert e.cached(a) == 0
    assert e.cached(a) == 6
    assert e.cached([1, 2, 3, 4, 9, 9]) == 4  # shares two leading blocks
    assert e.cached([0, 2, 3, 4]) == 0  # same later block, different start: no reuse
    assert e.cached(a) == 0  # evicted by the last two prompts (capacity 4 blocks)
    fresh = engine.Engine(SimulatorSettings(prefix_cache_blocks=4, block_tokens=2,
                                            prefill_ms_per_token=1.0))
    assert fresh.prefill_s([7, 7, 7]) == pytest.approx(0.003)
    assert fresh.prefill_s([7, 7, 7]) == pytest.approx(0.001)  # one full block was cached


def test_metrics_route_publishes_vllm_gauges() -> None:
    app = build_app(SimulatorSettings(model_names=("m",), max_batch=4))

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://sim") as c:
            return await c.get("/metrics")

    r = asyncio.run(go())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0' in r.text
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert health.gauge_sum(r.text, (name,)) == 0.0


def test_fail_status_answers_every_generation_request_with_it() -> None:
    app = build_app(SimulatorSettings(fail_status=500))

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://sim") as c:
            return await c.post("/v1/completions", content=orjson.dumps({"prompt": "x"}))

    r = asyncio.run(go())
    assert r.status_code == 500 and r.json()["error"]["code"] == 500


def test_completion_prompt_split_finds_the_text_so_far() -> None:
    key = b"k" * 32
    first = resume.first_word(key)
    assert first in tokens.VOCAB
    assert resume.splits("a b  c") == [("a b ", " c"), ("a", " b  c")]
