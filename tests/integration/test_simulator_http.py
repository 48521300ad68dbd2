"""The simulator as a real worker: `python -m simulator` on a loopback port, over HTTP.

Byte shapes follow wire-formats.md section 3 (vLLM 0.11); faults are the `[[sim ...]]`
directives. Every wait is bounded.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.integration import procs

pytestmark = pytest.mark.integration
MODEL = "sim-model"


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A simulator subprocess on a free port; its log must stay free of errors."""
    args = ("--model-name", MODEL, "--tokens", "6")
    proc, url = procs.simulator(tmp_path_factory.mktemp("simulator-http"), *args)
    try:
        yield url
    finally:
        proc.stop(grace=5)
    output = proc.output()
    assert "Traceback" not in output and "ERROR" not in output, output


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=httpx.Timeout(5.0)) as c:
        yield c


def sse(body: bytes) -> list[Any]:
    """Check SSE framing (every event `data: ...\\n\\n`, [DONE] last); return the payloads."""
    assert body.endswith(b"data: [DONE]\n\n")
    parts = body.split(b"\n\n")
    assert parts[-1] == b"" and all(p.startswith(b"data: ") for p in parts[:-1])
    assert parts[-2] == b"data: [DONE]"
    return [orjson.loads(p[6:]) for p in parts[:-2]]


def chat(text: str = "tell me", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def stats(client: httpx.Client) -> dict[str, Any]:
    return dict(client.get("/_sim/stats").json())


def test_chat_stream_framing_role_usage_and_request_id(client: httpx.Client) -> None:
    resp = client.post(
        "/v1/chat/completions",
        headers={"X-Request-Id": "it-1"},
        json=chat(stream=True, stream_options={"include_usage": True}),
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert resp.headers["x-request-id"] == "it-1"
    evs = sse(resp.content)
    assert evs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "prompt_token_ids" in evs[0] and all(e["id"] == "chatcmpl-it-1" for e in evs)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in evs[1:-1])
    final = evs[-2]["choices"][0]
    assert (final["finish_reason"], final["stop_reason"]) == ("stop", None)
    usage_chunk = evs[-1]
    assert usage_chunk["choices"] == []
    assert list(usage_chunk["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    assert usage_chunk["usage"]["completion_tokens"] == 7  # 6 words + EOS
    body = client.post("/v1/chat/completions", json=chat()).json()
    assert body["choices"][0]["message"]["content"] == text  # stream and body agree


def test_n2_choices_interleave_with_their_own_indices(client: httpx.Client) -> None:
    evs = sse(client.post("/v1/chat/completions", json=chat(stream=True, n=2)).content)
    order = [e["choices"][0]["index"] for e in evs]
    assert order[:2] == [0, 1] and order[2:6] == [0, 1, 0, 1]
    finals = [e["choices"][0] for e in evs if e["choices"][0]["finish_reason"]]
    assert sorted(c["index"] for c in finals) == [0, 1]


def test_logprobs_shapes_chat_and_completions(client: httpx.Client) -> None:
    evs = sse(
        client.post(
            "/v1/chat/completions", json=chat(stream=True, logprobs=True, top_logprobs=3)
        ).content
    )
    entry = evs[1]["choices"][0]["logprobs"]["content"][0]
    assert list(entry) == ["token", "logprob", "bytes", "top_logprobs"]
    assert entry["bytes"] == list(entry["token"].encode()) and entry["logprob"] < 0
    assert len(entry["top_logprobs"]) == 3 and list(entry["top_logprobs"][0]) == [
        "token",
        "logprob",
        "bytes",
    ]
    comp = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "hi", "logprobs": 2}
    ).json()
    lp = comp["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 7
    # k entries: the sampled (most likely) token is among the top k, listed once (vLLM
    # serving_completion.py _create_completion_logprobs over _make_logprob_dict's dict)
    assert all(isinstance(d, dict) and len(d) == 2 for d in lp["top_logprobs"])


def test_tool_call_deltas_stream_like_vllm(client: httpx.Client) -> None:
    """Under `auto` the first delta is the tool parser's, the name alone (vLLM 0.11
    tool_parsers/hermes_tool_parser.py: DeltaFunctionCall(name=...) dumped exclude_none)."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                },
            },
        }
    ]
    evs = sse(client.post("/v1/chat/completions", json=chat(stream=True, tools=tools)).content)
    deltas = [e["choices"][0]["delta"] for e in evs[1:]]
    head = deltas[0]["tool_calls"][0]
    assert head["id"].startswith("chatcmpl-tool-") and len(head["id"]) == len("chatcmpl-tool-") + 32
    assert head == {
        "id": head["id"],
        "type": "function",
        "index": 0,
        "function": {"name": "get_weather"},
    }
    frags = [d["tool_calls"][0] for d in deltas[1:] if "tool_calls" in d]
    assert len(frags) >= 2 and all(list(f) == ["index", "function"] for f in frags)
    args = orjson.loads("".join(f["function"]["arguments"] for f in frags))
    assert list(args) == ["city", "days"]
    assert evs[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_reasoning_content_before_content(client: httpx.Client) -> None:
    req = chat("think [[sim reasoning=3]]", stream=True)
    deltas = [
        e["choices"][0]["delta"] for e in sse(client.post("/v1/chat/completions", json=req).content)
    ]
    kinds = [next(iter(d)) for d in deltas[1:-1]]
    assert kinds == ["reasoning_content"] * 3 + ["content"] * 6
    kwargs = chat("think", chat_template_kwargs={"enable_thinking": True})
    msg = client.post("/v1/chat/completions", json=kwargs).json()["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"]


def test_finish_length_vs_stop(client: httpx.Client) -> None:
    cut = client.post("/v1/chat/completions", json=chat(max_tokens=2)).json()["choices"][0]
    assert (cut["finish_reason"], cut["stop_reason"]) == ("length", None)
    full = client.post("/v1/chat/completions", json=chat()).json()["choices"][0]
    word = full["message"]["content"].split()[2]
    stopped = client.post("/v1/chat/completions", json=chat(stop=[word])).json()["choices"][0]
    assert (stopped["finish_reason"], stopped["stop_reason"]) == ("stop", word)
    assert word not in stopped["message"]["content"]
    forced = client.post("/v1/chat/completions", json=chat("x [[sim finish=length]]")).json()
    assert forced["choices"][0]["finish_reason"] == "length"


def test_completions_list_prompt_stream(client: httpx.Client) -> None:
    req = {
        "model": MODEL,
        "prompt": ["a b", "c d e"],
        "n": 2,
        "stream": True,
        "max_tokens": 3,
        "stream_options": {"include_usage": True},
    }
    evs = sse(client.post("/v1/completions", json=req).content)
    indices = {e["choices"][0]["index"] for e in evs[:-1]}
    assert indices == {0, 1, 2, 3}
    assert evs[-1]["usage"] == {
        "prompt_tokens": 3 + 4,
        "total_tokens": 7 + 12,
        "completion_tokens": 12,
    }


def test_fail_503_then_success(client: httpx.Client) -> None:
    req = chat(f"[[sim fail=503 fail_times=1]] {uuid.uuid4().hex}")
    failed = client.post("/v1/chat/completions", json=req)
    assert failed.status_code == 503
    assert failed.json() == {
        "error": {
            "message": "Simulated failure (fail=503)",
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
    }
    assert client.post("/v1/chat/completions", json=req).status_code == 200


def test_error_after_sends_in_band_error_then_done(client: httpx.Client) -> None:
    resp = client.post("/v1/chat/completions", json=chat("[[sim error_after=2]]", stream=True))
    assert resp.status_code == 200
    parts = resp.content.split(b"\n\n")
    assert parts[-3:] == [
        b'data: {"error": {"message": "Simulated engine error (error_after)", '
        b'"type": "InternalServerError", "param": null, "code": 500}}',
        b"data: [DONE]",
        b"",
    ]
    assert len(parts) == 6  # role chunk, 2 token chunks, error, [DONE], tail


def test_drop_after_breaks_the_chunked_body(client: httpx.Client) -> None:
    got = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream(
            "POST", "/v1/chat/completions", json=chat("[[sim drop_after=2 itl_ms=5]]", stream=True)
        ) as resp,
    ):
        assert resp.status_code == 200
        for data in resp.iter_raw():
            got += data
    assert got.count(b"data: ") == 3 and b"[DONE]" not in got  # role chunk + 2 token chunks


def test_drop_before_sends_no_status_line(client: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/v1/completions", json={"model": MODEL, "prompt": "[[sim drop_before]]"})


def test_disconnect_is_counted_as_aborted_within_a_second(client: httpx.Client) -> None:
    before = stats(client)["aborted"]
    with client.stream(
        "POST", "/v1/chat/completions", json=chat("[[sim itl_ms=300 tokens=40]]", stream=True)
    ) as resp:
        next(resp.iter_raw())  # the role chunk and first token arrived; then hang up mid-sleep
    closed = time.time()
    deadline = time.monotonic() + 1.0
    while (now := stats(client))["aborted"] == before:
        assert time.monotonic() < deadline, "abort not seen within 1 s"
        time.sleep(0.02)
    assert now["aborted"] == before + 1 and now["last_abort_at"] - closed < 1.0


def test_hang_after_waits_until_the_client_leaves(client: httpx.Client) -> None:
    before = stats(client)["aborted"]
    with pytest.raises(httpx.ReadTimeout):
        client.post(
            "/v1/chat/completions",
            json=chat("[[sim hang_after=1]]", stream=True),
            timeout=httpx.Timeout(5.0, read=0.3),
        )
    deadline = time.monotonic() + 1.0
    while stats(client)["aborted"] == before:
        assert time.monotonic() < deadline, "hung request not aborted within 1 s"
        time.sleep(0.02)


def test_ttft_and_itl_delay_the_stream_and_the_body(client: httpx.Client) -> None:
    start = time.monotonic()
    req = chat("[[sim ttft_ms=200 itl_ms=50 tokens=4]]", stream=True)
    with client.stream("POST", "/v1/chat/completions", json=req) as resp:
        chunks = resp.iter_raw()
        next(chunks)
        first = time.monotonic() - start
        rest = b"".join(chunks)
    total = time.monotonic() - start
    assert rest.endswith(b"data: [DONE]\n\n")
    assert 0.2 <= first < 2.0
    assert total >= 0.2 + 4 * 0.05  # 5 steps (4 words + EOS): 4 gaps after the first
    start = time.monotonic()
    client.post("/v1/chat/completions", json=chat("[[sim ttft_ms=100 itl_ms=20 tokens=4]]"))
    assert time.monotonic() - start >= 0.1 + 4 * 0.02


def test_non_stream_faults(client: httpx.Client) -> None:
    failed = client.post("/v1/chat/completions", json=chat("[[sim error_after=1]]"))
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "InternalServerError"
    with pytest.raises(httpx.RemoteProtocolError):
        client.post("/v1/chat/completions", json=chat("[[sim drop_after=1]]"))


def test_openai_sdk_reads_stream_and_tool_calls(base_url: str) -> None:
    import openai
    sdk = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", timeout=5, max_retries=0)
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    done = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], tools=tools
    )
    assert done.choices[0].finish_reason == "tool_calls"
    assert done.choices[0].message.tool_calls[0].function.name == "f"


def test_gateway_simulate_runs_the_simulator_on_its_own(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SPEC.md, Command line: `gateway simulate [--port P] [options]` runs the simulator
    worker on its own: vLLM's OpenAI API, its options taken (`--model-name`, `--tokens`)."""
    import sys

    port = procs.free_port()
    proc = procs.Proc([sys.executable, "-m", "gateway", "simulate", "--host", "127.0.0.1",
                       "--port", str(port), "--model-name", "m", "--tokens", "2"],
                      tmp_path / "simulate.log")
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(url + "/health")
        body = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "hi"},
                          timeout=5).json()
        models = httpx.get(url + "/v1/models", timeout=5).json()
    finally:
        proc.stop(grace=5)
    assert body["object"] == "text_completion" and len(body["choices"][0]["text"].split()) == 2
    assert body["choices"][0]["finish_reason"] == "stop"  # its natural end: `--tokens 2`
    assert [m["id"] for m in models["data"]] == ["m"]


def test_named_tool_calls_are_numbered_by_their_choice(client: httpx.Client) -> None:
    """vLLM 0.11 serving_chat.py chat_completion_stream_generator, named `tool_choice`:
    `DeltaToolCall(id, type, function=DeltaFunctionCall(name, arguments), index=i)` with `i`
    the choice's index, its fragments too; `required` sends name and arguments but numbers
    calls from 0 (extract_tool_call_required_streaming)."""
    fn = {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}
    tools = [{"type": "function", "function": fn}]
    named = {"type": "function", "function": {"name": "f"}}
    for choice, first_index in ((named, 1), ("required", 0)):
        evs = sse(client.post("/v1/chat/completions", json=chat(
            stream=True, tools=tools, tool_choice=choice, n=2)).content)
        calls = [c["delta"]["tool_calls"][0] for e in evs for c in e["choices"]
                 if c["index"] == 1 and "tool_calls" in c["delta"]]
        assert calls[0]["function"] == {"name": "f", "arguments": ""}
        assert {c["index"] for c in calls} == {first_index}
