"""SageMaker-style LMI clients against a running gateway in front of the simulator worker.

Real processes on free loopback ports; plain httpx, as a client whose endpoint URL now points at
the gateway. Models: `demo` (default, vLLM), `tgi-model` (lmi.tgi_compat), `sse-model`
(lmi.output_formatter sse), `plain` / `trt` on the generic OpenAI and trtllm-serve worker
protocols, which give no token ids (so details get a 424 there, before any I/O), and `my-lora`,
a LoRA adapter of the same worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.integration import procs

pytestmark = pytest.mark.integration

PROMPT = "What is Deep Learning?"
MSGS = [{"role": "user", "content": "What is deep learning?"}]


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("lmi")
    sim, sim_url = procs.simulator(tmp)
    models = "".join(f"""
  - name: {name}
    backend: {backend}
    upstreams: [{sim_url}]
    upstream_model: org/demo-model
    lmi: {lmi}""" for name, backend, lmi in (
        ("demo", "vllm", "{}"), ("tgi-model", "vllm", "{tgi_compat: true}"),
        ("sse-model", "vllm", "{output_formatter: sse}"), ("plain", "openai", "{}"),
        ("trt", "trtllm", "{}")))
    # a LoRA served by the same worker under its own name (vLLM --lora-modules my-lora=...)
    models += f"""
  - name: my-lora
    backend: vllm
    upstreams: [{sim_url}]
    upstream_model: my-lora"""
    # failover off: a test reads the error line a cut stream ends with (see test_failover.py)
    gw, url = procs.gateway(tmp, f"""
server: {{timeouts: {{first_byte: 10, idle: 5}}, failover_attempts: 0}}
default_model: demo
models:{models}
""")
    try:
        yield url, sim_url
    finally:
        gw.stop()
        sim.stop()


def post(urls: tuple[str, str], body: dict[str, Any], path: str = "/invocations") -> httpx.Response:
    return httpx.post(urls[0] + path, json=body, timeout=20)


def upstream(urls: tuple[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(urls[1] + "/_sim/last_request", timeout=5).json()
    return out


def lines(r: httpx.Response, sse: bool) -> list[dict[str, Any]]:
    if sse:
        assert r.text.endswith("\n\n") and "[DONE]" not in r.text
        return [orjson.loads(e.removeprefix("data: ")) for e in r.text.split("\n\n") if e]
    return [orjson.loads(x) for x in r.text.splitlines()]


def test_inputs_whole_with_details(urls: tuple[str, str]) -> None:
    r = post(urls, {"inputs": PROMPT, "parameters": {"max_new_tokens": 5, "details": True,
                                                     "stop_sequences": ["zzz"]}})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    out = r.json()
    assert list(out) == ["generated_text", "details"]
    d = out["details"]
    assert list(d) == ["finish_reason", "generated_tokens", "inputs", "tokens"]
    assert (d["finish_reason"], d["generated_tokens"], d["inputs"]) == ("length", 5, PROMPT)
    assert "".join(t["text"] for t in d["tokens"]) == out["generated_text"]
    assert all(set(t) == {"id", "text", "log_prob"} for t in d["tokens"])
    sent = upstream(urls)
    assert sent["path"] == "/v1/completions"
    body = sent["body"]
    assert (body["prompt"], body["max_tokens"], body["stop"], body["temperature"]) == (
        PROMPT, 5, ["zzz"], 0.0)
    assert body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["model"] == "org/demo-model"


def test_inputs_defaults_return_full_text_and_prefill(urls: tuple[str, str]) -> None:
    out = post(urls, {"inputs": PROMPT}).json()
    assert list(out) == ["generated_text"] and upstream(urls)["body"]["max_tokens"] == 30
    full = post(urls, {"inputs": PROMPT, "parameters": {"return_full_text": True}}).json()
    assert full["generated_text"] == PROMPT + out["generated_text"]
    pre = post(urls, {"inputs": PROMPT, "parameters": {"details": True, "max_new_tokens": 2,
                                                       "decoder_input_details": True}}).json()
    assert pre["details"]["prefill"][0]["id"] == 1  # the simulator's BOS; no logprobs from it
    assert upstream(urls)["body"]["prompt_logprobs"] == 1


def test_inputs_stream_jsonlines_matches_whole(urls: tuple[str, str]) -> None:
    whole = post(urls, {"inputs": PROMPT, "parameters": {"max_new_tokens": 6}}).json()
    r = post(urls, {"inputs": PROMPT, "stream": True,
                    "parameters": {"max_new_tokens": 6, "details": True}})
    assert r.status_code == 200 and r.headers["content-type"] == "application/jsonlines"
    got = lines(r, sse=False)
    assert len(got) == 6 and all(set(x) == {"token"} for x in got[:-1])
    assert got[-1]["generated_text"] == whole["generated_text"]
    assert "".join(x["token"]["text"] for x in got) == whole["generated_text"]
    assert got[-1]["details"] == {"finish_reason": "length", "generated_tokens": 6,
                                  "inputs": PROMPT}


def test_inputs_stream_eos(urls: tuple[str, str]) -> None:
    """The simulator ends with EOS after its natural length: the EOS token carries the end,
    with its own text as the worker decodes it (DJL: the Token's text is vLLM's
    `decoded_token`; the whole answer's details.tokens say `</s>` too)."""
    got = lines(post(urls, {"inputs": PROMPT, "stream": True,
                            "parameters": {"details": True, "max_new_tokens": 200}}), False)
    assert got[-1]["details"]["finish_reason"] == "eos_token"
    assert got[-1]["token"]["text"] == "</s>" and got[-1]["token"]["id"] == 2  # the EOS token
    assert not got[-1]["generated_text"].endswith("</s>")


def test_mid_stream_failure_ends_with_the_error_line(urls: tuple[str, str]) -> None:
    r = post(urls, {"inputs": PROMPT + " [[sim drop_after=3]]", "stream": True,
                    "parameters": {"max_new_tokens": 10}})
    assert r.status_code == 200
    got = lines(r, sse=False)
    assert len(got) == 4
    assert got[-1] == {"token": {"id": -1, "text": "", "log_prob": -1, "special_token": True},
                       "generated_text": "",
                       "details": {"finish_reason": "error", "generated_tokens": None,
                                   "inputs": None}}


def test_non_stream_generation_failure_body(urls: tuple[str, str]) -> None:
    r = post(urls, {"inputs": PROMPT + " [[sim error_after=2]]", "parameters": {"details": True}})
    assert r.status_code == 502
    body = r.json()
    assert list(body) == ["error", "code"] and body["code"] == 502 and body["error"]


def test_tgi_compat_model(urls: tuple[str, str]) -> None:
    whole = post(urls, {"inputs": PROMPT, "parameters": {"max_new_tokens": 3}},
                 "/predictions/tgi-model").json()
    assert isinstance(whole, list) and len(whole) == 1
    assert whole[0]["details"]["tokens"][0].keys() == {"id", "text", "logprob"}
    r = post(urls, {"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 3}},
             "/predictions/tgi-model")
    assert r.headers["content-type"] == "text/event-stream"
    got = lines(r, sse=True)
    assert [set(x["token"]) for x in got] == [{"id", "text", "logprob"}] * 3
    assert got[-1]["details"]["generated_tokens"] == 3  # details on by default
    assert got[-1]["generated_text"] == whole[0]["generated_text"]


def test_sse_model_frames_inputs_and_chat(urls: tuple[str, str]) -> None:
    r = post(urls, {"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 3}},
             "/predictions/sse-model")
    got = lines(r, sse=True)
    assert len(got) == 3 and "details" not in got[-1] and "generated_text" in got[-1]
    r = post(urls, {"messages": MSGS, "stream": True, "max_tokens": 3}, "/predictions/sse-model")
    assert r.headers["content-type"] == "text/event-stream"
    chunks = lines(r, sse=True)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]


def test_chat_whole_and_stream(urls: tuple[str, str]) -> None:
    whole = post(urls, {"messages": MSGS, "max_tokens": 4, "model": "anything"}).json()
    assert list(whole) == ["id", "object", "created", "choices", "usage"]
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-")
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 4
    assert upstream(urls)["body"]["model"] == "org/demo-model"  # body `model` ignored
    r = post(urls, {"messages": MSGS, "max_tokens": 4, "stream": True, "logprobs": True,
                    "top_logprobs": 1})
    assert r.headers["content-type"] == "application/jsonlines"
    chunks = lines(r, sse=False)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    lp = chunks[0]["choices"][0]["logprobs"]
    assert isinstance(lp, list) and isinstance(lp[0]["content"][0]["top_logprobs"][0]["token"], str)


def test_prompt_completion_whole_list_and_stream(urls: tuple[str, str]) -> None:
    whole = post(urls, {"prompt": [PROMPT, "Hi"], "max_tokens": 3}).json()
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert list(whole["usage"]) == ["prompt_tokens", "completion_tokens", "total_tokens",
                                    "prompt_tokens_details"]
    r = post(urls, {"prompt": PROMPT, "max_tokens": 3, "stream": True})
    assert r.text.endswith("data: [DONE]\n\n")
    events = [orjson.loads(e.removeprefix("data: ")) for e in r.text.split("\n\n")
              if e and e != "data: [DONE]"]
    assert "".join(e["choices"][0]["text"] for e in events) == whole["choices"][0]["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["usage"] is None for e in events)


def test_dynamic_batch(urls: tuple[str, str]) -> None:
    r = post(urls, {"inputs": [PROMPT, "Hi"], "parameters": {"max_new_tokens": 2}})
    assert r.status_code == 200 and r.text.startswith('[\n  {\n    "generated_text":"')
    assert len(r.json()) == 2


def test_num_beams_returns_every_beam(urls: tuple[str, str]) -> None:
    """Seed 003 BestOfSequence: "also returned when beam search is enabled with the option
    num_beams > 1" (vLLM block: "Greedy (Default), Sampling, and Beam search")."""
    r = post(urls, {"inputs": PROMPT, "parameters": {"num_beams": 2, "max_new_tokens": 2}})
    assert r.status_code == 200
    d = r.json()["details"]
    assert list(d)[0] == "inputs" and len(d["best_of_sequences"]) == 1
    sent = upstream(urls)["body"]
    assert (sent["use_beam_search"], sent["n"]) == (True, 2)


def test_dynamic_batch_stream(urls: tuple[str, str]) -> None:
    """Seed 003 Dynamic Batch, streaming: `{"outputs": [...]}` JSON lines, one text per input
    at each step (DJL outputs.py `_default_stream_output_formatter`), whose texts join into
    the whole answer's `generated_text` of each input."""
    body = {"inputs": [PROMPT, "Hi"], "parameters": {"max_new_tokens": 3}}
    r = post(urls, {**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"] == "application/jsonlines"
    rows = [orjson.loads(x)["outputs"] for x in r.text.splitlines()]
    assert len(rows) == 3 and all(len(row) == 2 for row in rows)
    sent = upstream(urls)["body"]
    assert sent["prompt"] == [PROMPT, "Hi"] and sent["stream"] is True
    whole = post(urls, body).json()
    assert ["".join(col) for col in zip(*rows)] == [w["generated_text"] for w in whole]


@pytest.mark.parametrize("model", ["plain", "trt"])
def test_other_worker_kinds(urls: tuple[str, str], model: str) -> None:
    ok = post(urls, {"inputs": PROMPT, "parameters": {"max_new_tokens": 3}},
              f"/predictions/{model}")
    assert ok.status_code == 200 and ok.json()["generated_text"]
    chat = post(urls, {"messages": MSGS, "max_tokens": 3}, f"/predictions/{model}")
    assert chat.status_code == 200 and chat.json()["choices"][0]["finish_reason"] == "length"
    # Details and token lines carry ids these workers do not give: -1, "unknown" (SPEC.md),
    # never a refusal; the prompt's tokens, asked for by name, are a 424.
    details = post(urls, {"inputs": PROMPT, "parameters": {"details": True}},
                   f"/predictions/{model}").json()["details"]
    assert details["tokens"] == [] or {t["id"] for t in details["tokens"]} == {-1}
    lines = [orjson.loads(x) for x in post(urls, {"inputs": PROMPT, "stream": True},
                                           f"/predictions/{model}").text.splitlines()]
    assert {ln["token"]["id"] for ln in lines} == {-1} and lines[-1]["generated_text"]
    refused = post(urls, {"inputs": PROMPT, "parameters": {"details": True,
                                                          "decoder_input_details": True}},
                   f"/predictions/{model}")
    assert refused.status_code == 424 and set(refused.json()) == {"error", "code"}


def test_a_versioned_predictions_url_serves_its_model(urls: tuple[str, str]) -> None:
    """DJL InferenceRequestHandler (`predictions`): a fourth path segment is the model's
    version, and the request is served by that model."""
    versioned = post(urls, {"inputs": PROMPT, "parameters": {"max_new_tokens": 3}},
                     "/predictions/tgi-model/1")
    assert versioned.status_code == 200
    assert versioned.json() == post(urls, {"inputs": PROMPT, "parameters": {"max_new_tokens": 3}},
                                    "/predictions/tgi-model").json()
    assert post(urls, {"inputs": PROMPT}, "/predictions/nope/1").status_code == 404


def test_errors_and_ping(urls: tuple[str, str]) -> None:
    bad = post(urls, {"inputs": PROMPT, "parameters": {"max_new_tokens": 0}})
    assert bad.status_code == 424 and bad.json()["code"] == 424
    assert post(urls, {"inputs": PROMPT}, "/predictions/nope").status_code == 404
    ping = httpx.get(urls[0] + "/ping", timeout=5)
    assert ping.status_code == 200
    assert ping.json()["demo"] == {"status": "Healthy"} and ping.text.endswith("}\n")


def test_a_lora_adapter_is_the_model_the_worker_is_sent(urls: tuple[str, str]) -> None:
    """DJL Serving input_parser.py `_fetch_adapters_from_input` (the body's `adapters`, then
    the `X-Amzn-SageMaker-Adapter-Identifier` header, which wins) and adapters.md's calls; the
    LoRA reaches vLLM as its model name (vllm_async_service.py sets `model` to the adapter).
    An unregistered adapter is DJL's 424 "Adapter <name> is not registered"."""
    r = post(urls, {"inputs": PROMPT, "adapters": "my-lora", "parameters": {"max_new_tokens": 3}})
    assert r.status_code == 200 and r.json()["generated_text"]
    sent = upstream(urls)
    assert (sent["path"], sent["body"]["model"]) == ("/v1/completions", "my-lora")
    header = {"X-Amzn-SageMaker-Adapter-Identifier": "my-lora"}
    chat = httpx.post(urls[0] + "/invocations", json={"messages": MSGS, "max_tokens": 3},
                      headers=header, timeout=20)
    assert chat.status_code == 200 and chat.json()["choices"][0]["finish_reason"] == "length"
    sent = upstream(urls)
    assert (sent["path"], sent["body"]["model"]) == ("/v1/chat/completions", "my-lora")
    post(urls, {"prompt": PROMPT, "max_tokens": 2})
    assert upstream(urls)["body"]["model"] == "org/demo-model"  # no adapter: the base model
    gone = post(urls, {"inputs": PROMPT, "adapters": "no-such-lora"})
    assert (gone.status_code, gone.content) == (
        424, b'{"error":"Adapter no-such-lora is not registered","code":424}')
