"""Which gateway errors the official clients retry on their own, against what they do with the
real server: a retry the real server would not draw multiplies the worker's load.

elastic-transport (`_transport.py` Transport.perform_request) retries the statuses in
`retry_on_status`, by default 429, 502, 503 and 504, up to `max_retries` (3) times.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from elasticsearch import ApiError, Elasticsearch

from tests.integration import procs

pytestmark = pytest.mark.integration

SSE = {"accept": "text/event-stream", "content-type": "application/json"}
SLOW = "[[sim ttft_ms=3000]] hello"


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("sdkretry")
    with procs.demo_gateway(tmp, "{timeouts: {first_byte: 1}, failover_attempts: 0, "
                                 "health: {eject_after: 1000}}") as urls:
        yield urls


def worker_requests(sim: str) -> int:
    return int(httpx.get(sim + "/_sim/stats", timeout=5).json()["requests"])


def test_elasticsearch_py_does_not_retry_a_worker_too_slow_to_answer(
        urls: tuple[str, str]) -> None:
    """Elasticsearch answers an inference its provider did not answer in time with 408
    "Request timed out after [..]" (x-pack inference RequestTask; RequestTaskTests
    testRequest_ReturnsTimeoutException: status 408), which elastic-transport does not retry. A
    504 there was sent again three times by the client's defaults: four generations queued on
    the worker for one call, and four times the wait."""
    url, sim = urls
    es = Elasticsearch(url, request_timeout=20)  # the client's default retries
    before = worker_requests(sim)
    with pytest.raises(ApiError) as whole:
        es.inference.completion(inference_id="demo", input=SLOW)
    assert (whole.value.status_code, whole.value.message) == (408, "status_exception")
    assert whole.value.body["status"] == 408
    assert "nothing within 1s" in whole.value.body["error"]["reason"]
    with pytest.raises(ApiError) as streamed:
        es.perform_request("POST", "/_inference/chat_completion/demo/_stream", headers=SSE,
                           body={"messages": [{"role": "user", "content": SLOW}]})
    assert streamed.value.status_code == 408
    assert streamed.value.body.startswith("event: error\ndata: {")
    assert '"code":"request_timeout"' in streamed.value.body
    assert worker_requests(sim) - before == 2  # one generation per call
