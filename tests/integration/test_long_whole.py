"""Whole answers that take longer than `timeouts.first_byte` to generate (gateway.whole).

`first_byte` is the time to the worker's first byte (queueing + prefill, SPEC.md); a worker
asked for one JSON body sends nothing until the generation ends. So a whole answer that may be
long is asked of the worker as a stream and folded: it is cut only by a silence of
`first_byte` before its first token or of `idle` between two; and one asked as a body (bounded
small, or needing what only a body carries) gets `first_byte + limit / DECODE_RATE`.
Real gateway and simulator processes; /_sim/last_request shows what the worker was sent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration import procs

pytestmark = pytest.mark.integration

SLOW = "[[sim tokens=20 itl_ms=100]]"  # the first token at once, the answer after 2 s


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("long-whole")
    sim, sim_url = procs.simulator(tmp)
    gw, url = procs.gateway(tmp, f"""
server: {{timeouts: {{first_byte: 1, idle: 1}}, retries: 0, failover_attempts: 0,
          health: {{eject_after: 1000}}}}
default_model: demo
models:
  - {{name: demo, backend: vllm, upstreams: [{sim_url}]}}
  - {{name: trt, backend: trtllm, upstreams: [{sim_url}], upstream_model: demo}}
""")
    try:
        yield url, sim_url
    finally:
        gw.stop()
        sim.stop()


def post(urls: tuple[str, str], path: str, body: dict[str, Any]
         ) -> tuple[httpx.Response, dict[str, Any], float]:
    start = time.monotonic()
    r = httpx.post(urls[0] + path, json=body, timeout=30)
    took = time.monotonic() - start
    sent: dict[str, Any] = httpx.get(urls[1] + "/_sim/last_request", timeout=5).json()["body"]
    return r, sent, took


def chat(text: str, **kw: Any) -> dict[str, Any]:
    return {"model": "demo", "messages": [{"role": "user", "content": text}], **kw}


LONG = {
    "openai-chat": ("/v1/chat/completions", chat(f"Tell me. {SLOW}"),
                    lambda b: b["usage"]["completion_tokens"]),
    "openai-trtllm": ("/v1/chat/completions", {**chat(f"Tell me. {SLOW}"), "model": "trt"},
                      lambda b: b["usage"]["completion_tokens"]),
    "openai-completions": ("/v1/completions", {"model": "demo", "prompt": f"Once {SLOW}",
                                               "max_tokens": 100},
                           lambda b: b["usage"]["completion_tokens"]),
    "lmi-inputs": ("/invocations", {"inputs": f"Once {SLOW}", "parameters": {
        "max_new_tokens": 100, "details": True}}, lambda b: b["details"]["generated_tokens"]),
    "tgi-generate": ("/generate", {"inputs": f"Once {SLOW}", "parameters": {"details": True}},
                     lambda b: b["details"]["generated_tokens"]),
    "elastic-completion": ("/_inference/completion/demo", {"input": f"Tell me. {SLOW}"},
                           lambda b: len(b["completion"][0]["result"].split())),
}


@pytest.mark.parametrize("name", list(LONG))
def test_a_whole_answer_longer_than_first_byte_is_folded_from_a_stream(
        urls: tuple[str, str], name: str) -> None:
    path, body, count = LONG[name]
    r, sent, took = post(urls, path, body)
    assert r.status_code == 200, r.text
    assert count(r.json()) >= 20  # the simulator counts its end-of-sequence token too
    assert took > 1.5  # longer than first_byte: once a 504
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_a_worker_silent_past_first_byte_is_still_a_504(urls: tuple[str, str]) -> None:
    r, sent, took = post(urls, "/v1/chat/completions", chat("hi [[sim ttft_ms=3000]]"))
    assert sent["stream"] is True
    assert r.status_code == 504
    assert r.json()["error"]["message"] == "the worker sent nothing within 1s"
    assert took < 2.5


def test_a_worker_silent_past_first_byte_is_a_504_in_the_lmi_form(urls: tuple[str, str]) -> None:
    r, _, _ = post(urls, "/invocations", {"inputs": "hi [[sim ttft_ms=3000]]",
                                          "parameters": {"max_new_tokens": 100}})
    assert r.status_code == 504
    assert r.json() == {"error": "the worker sent nothing within 1s", "code": 504}


def test_a_folded_answer_whose_worker_stalls_is_a_504_not_a_short_answer(
        urls: tuple[str, str]) -> None:
    r, sent, _ = post(urls, "/v1/chat/completions", chat("hi [[sim tokens=20 hang_after=3]]"))
    assert sent["stream"] is True
    assert r.status_code == 504, r.text
    assert r.json()["error"]["message"] == "the worker sent nothing for 1s"


def test_a_bounded_small_answer_stays_one_body_with_time_for_its_decode(
        urls: tuple[str, str]) -> None:
    """2 tokens <= first_byte * 2: one body, whose deadline is first_byte + 2 / 2 = 2 s; the
    worker answers after 1.4 s, past first_byte."""
    r, sent, took = post(urls, "/v1/chat/completions",
                         chat("hi [[sim ttft_ms=1400]]", max_tokens=2))
    assert sent["stream"] is False and "stream_options" not in sent
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    assert took > 1.2


def test_a_bounded_body_past_its_allowance_is_a_504(urls: tuple[str, str]) -> None:
    r, sent, took = post(urls, "/v1/chat/completions",
                         chat("hi [[sim ttft_ms=3000]]", max_tokens=2))
    assert sent["stream"] is False
    assert r.status_code == 504
    assert r.json()["error"]["message"] == "the worker sent nothing within 2s"
    assert took > 1.8  # its allowance, not first_byte (1 s); the 504 shows it did not wait
    # for the worker's answer at 3 s (an upper bound on a wall clock would flake on slow CI)


def test_what_only_a_body_carries_stays_a_body_with_a_finite_deadline(
        urls: tuple[str, str]) -> None:
    """Prompt logprobs come only in vLLM's non-streaming answer; with no `max_tokens` the
    body may take first_byte + 10 idle gaps (11 s here), so 2 s of generation is answered."""
    r, sent, took = post(urls, "/v1/chat/completions",
                         chat(f"hi {SLOW}", prompt_logprobs=1))
    assert sent["stream"] is False and sent["prompt_logprobs"] == 1
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 20
    assert took > 1.5
