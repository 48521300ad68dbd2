"""What judges an upstream: only what its worker did. A request the gateway refuses itself
while building it (a chat the model's `chat_template` cannot render: Hugging Face templates
`raise_exception` on roles out of turn) reaches no worker, so it is no attempt, neither a
success nor a failure of the upstream it was routed to (SPEC.md: upstreams failing in a row
are ejected and tried again half-open; Envoy's outlier detection counts the host's own
responses)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters import base
from gateway import config, pipeline, routing
from schemas import canonical, errors

pytestmark = pytest.mark.anyio

A = "http://a:8000"
TEMPLATE = ("{% if messages[0].role != 'user' %}{{ raise_exception('roles must start with "
            "user') }}{% endif %}{{ messages[0].content }}")
BAD = canonical.InferenceRequest(model="m", messages=[canonical.Message("assistant", "hi")],
                                 stream=True, sampling=canonical.Sampling(max_tokens=5))


class Nobody:
    """No worker may be asked."""

    async def send(self, req: base.UpstreamRequest) -> Any:
        raise AssertionError("a request that could not be built was sent")

    async def check(self, url: str, timeout: float,
                    host: str | None = None) -> tuple[int, str]:
        return 200, ""

    async def aclose(self) -> None:
        return None


def triton() -> tuple[routing.Route, pipeline.Pipeline]:
    cfg = config.Config.model_validate({
        "server": {"health": {"eject_after": 2, "backoff": 5}},
        "models": [{"name": "m", "backend": "triton", "upstreams": [A],
                    "chat_template": TEMPLATE}]})
    route = routing.Router(cfg).resolve("m")
    route.upstreams.probed(A, True)
    return route, pipeline.Pipeline(Nobody(), cfg.server)


async def test_a_request_refused_while_built_does_not_break_a_run_of_failures() -> None:
    route, flow = triton()
    ups = route.upstreams
    ups.end(A, t := ups.begin(A))
    ups.failed(A, t)  # the worker failed once
    note = pipeline.Attempt()
    with pytest.raises(errors.InvalidRequest):
        await flow.open(route, BAD, "rid", note)
    assert note.attempts == 0 and ups.health[A].in_flight == 0
    ups.end(A, t := ups.begin(A))
    assert ups.failed(A, t) is True  # its second failure in a row ejects it


async def test_a_request_refused_while_built_does_not_restore_a_half_open_upstream() -> None:
    route, flow = triton()
    ups = route.upstreams
    ups.end(A, t := ups.begin(A))
    ups.failed(A, t)
    ups.end(A, t := ups.begin(A))
    ups.failed(A, t)  # ejected
    ups.clock = lambda: float("inf")  # its backoff is over: half-open
    with pytest.raises(errors.InvalidRequest):
        await flow.open(route, BAD, "rid", pipeline.Attempt())
    h = ups.health[A]
    assert h.ejected_until and not h.trial  # still waiting for a real trial
    trial = ups.begin(A)
    ups.end(A, trial)
    assert ups.failed(A, trial) is True and h.backoff == 10  # that trial decides
