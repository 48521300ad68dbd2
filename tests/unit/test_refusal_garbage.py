"""A refused request leaves nothing to the garbage collector: the error it is answered with is
dropped by the request's frame once answered, so the error's traceback (which holds that frame,
and through it the request's exchange and connection cycle) is freed when the request ends.
Kept, the cycle waited for a collection, which under a flood of bad requests runs more often
and, once such cycles reach an older generation, walks every object of every stream in flight
(bench/RESULTS.md sections 23 and 24)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from gateway import config, exchange
from tests.fakes import hosts

CFG = config.Config.model_validate({
    "default_model": "m", "models": [{"name": "m", "upstreams": ["http://w:8000"]}]})


@pytest.mark.anyio
@pytest.mark.parametrize(("body", "status"), [
    ({"model": "m", "messages": "not a list"}, 400),
    ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404)])
async def test_a_refused_request_leaves_no_cycle(body: dict[str, Any], status: int) -> None:
    async with hosts.serve(CFG, {}) as client:
        for _ in range(2):  # the first request's imports and caches are not the request's
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status_code == status
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(3):
                resp = await client.post("/v1/chat/completions", json=body)
                assert resp.status_code == status
            gc.collect()
            kept = [o for o in gc.garbage if isinstance(o, exchange.Exchange)]
            assert kept == []
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
