"""The simulator app in-process: vLLM 0.11 byte shapes, validation errors and test endpoints.

Byte shapes follow wire-formats.md section 3 (vLLM 0.11 `protocol.py`, `serving_chat.py`,
`serving_completion.py`).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import SimulatorSettings, build_app

Headers = dict[str, str]


def call(
    app: Any,
    method: str,
    path: str,
    body: Any = None,
    headers: Headers | None = None,
    raw: bytes | None = None,
) -> httpx.Response:
    """One request through httpx's ASGI transport."""

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as c:
            content = raw if raw is not None else (None if body is None else orjson.dumps(body))
            return await c.request(method, path, content=content, headers=headers, timeout=10)

    return asyncio.run(go())


@pytest.fixture
def app() -> Any:
    return build_app(SimulatorSettings(tokens=3))


def events(resp: httpx.Response) -> list[Any]:
    """SSE `data:` payloads, checking the framing; [DONE] last and returned as the string."""
    body = resp.content
    assert body.endswith(b"data: [DONE]\n\n")
    parts = body.split(b"\n\n")
    assert parts[-1] == b""
    assert all(p.startswith(b"data: ") for p in parts[:-1])
    return [orjson.loads(p[6:]) if p != b"data: [DONE]" else "[DONE]" for p in parts[:-1]]


def chat(content: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def test_chat_stream_exact_bytes(app: Any) -> None:
    resp = call(
        app,
        "POST",
        "/v1/chat/completions",
        chat(stream=True, stream_options={"include_usage": True}),
        headers={"x-request-id": "r1"},
    )
    assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert resp.headers["x-request-id"] == "r1"
    words = [e["choices"][0]["delta"]["content"] for e in events(resp)[1:4]]
    text = re.sub(rb'"created":\d+', b'"created":1', resp.content).decode()
    head = (
        '{"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1,"model":"m","choices":['
    )
    tail = ',"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
    expected = (
        f'data: {head}{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,'
        '"finish_reason":null}],"prompt_token_ids":null}\n\n'
        + "".join(f'data: {head}{{"index":0,"delta":{{"content":"{w}"}}{tail}' for w in words)
        + f'data: {head}{{"index":0,"delta":{{"content":""}},"logprobs":null,'
        '"finish_reason":"stop","stop_reason":null,"token_ids":null}]}\n\n'
        f'data: {head}],"usage":{{"prompt_tokens":6,"total_tokens":10,"completion_tokens":4}}}}\n\n'
        "data: [DONE]\n\n"
    )
    assert text == expected


def test_chat_non_stream_fields_in_vllm_order(app: Any) -> None:
    body = call(app, "POST", "/v1/chat/completions", chat()).json()
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "kv_transfer_params",
    ]
    choice = body["choices"][0]
    assert list(choice) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert list(choice["message"]) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "tool_calls",
        "reasoning_content",
    ]
    assert list(body["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
    ]
    assert body["usage"]["completion_tokens"] == 4 and choice["message"]["tool_calls"] == []
    again = call(app, "POST", "/v1/chat/completions", chat()).json()
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]


def test_completions_stream_chunks_carry_every_field(app: Any) -> None:
    req = {
        "model": "m",
        "prompt": ["one two", "three"],
        "n": 2,
        "stream": True,
        "return_token_ids": True,
        "echo": True,
    }
    evs = events(call(app, "POST", "/v1/completions", req))
    chunks = evs[:-1]
    assert all(list(c) == ["id", "object", "created", "model", "choices", "usage"] for c in chunks)
    assert all(c["usage"] is None and c["object"] == "text_completion" for c in chunks)
    first: dict[int, dict[str, Any]] = {}
    for c in chunks:
        ch = c["choices"][0]
        assert list(ch) == [
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "stop_reason",
            "prompt_token_ids",
            "token_ids",
        ]
        first.setdefault(ch["index"], ch)
    assert sorted(first) == [0, 1, 2, 3]  # index = prompt_idx * n + i
    assert first[0]["text"].startswith("one two") and first[2]["text"].startswith("three")
    assert first[3]["prompt_token_ids"] is not None and len(first[3]["prompt_token_ids"]) == 2
    later = [
        c["choices"][0] for c in chunks if c["choices"][0] is not first[c["choices"][0]["index"]]
    ]
    assert later and all(ch["prompt_token_ids"] is None for ch in later)
    assert all(not ch["text"].startswith(("one", "three")) for ch in later)


def test_completions_non_stream_with_token_prompt_and_logprobs(app: Any) -> None:
    body = call(
        app,
        "POST",
        "/v1/completions",
        {"prompt": [1000, 1001, 1002], "logprobs": 2, "max_tokens": 2},
    ).json()
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "kv_transfer_params",
    ]
    choice = body["choices"][0]
    assert list(choice) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "prompt_logprobs",
        "prompt_token_ids",
    ]
    lp = choice["logprobs"]
    assert list(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    assert len(lp["tokens"]) == 2 and all(len(d) == 2 for d in lp["top_logprobs"])  # k
    assert lp["text_offset"][1] == len(lp["tokens"][0]) and choice["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": None,
    }


def test_return_token_ids_and_continuous_usage(app: Any) -> None:
    req = chat(
        stream=True,
        return_token_ids=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    evs = events(call(app, "POST", "/v1/chat/completions", req))
    role, tokens_, usage_chunk = evs[0], evs[1:-2], evs[-2]
    assert list(role) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "prompt_token_ids",
    ]
    assert role["usage"]["completion_tokens"] == 0 and len(role["prompt_token_ids"]) == 6
    assert [e["usage"]["completion_tokens"] for e in tokens_] == [1, 2, 3, 4]
    assert all(len(e["choices"][0]["token_ids"]) == 1 for e in tokens_)
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    "opts, usage", [({}, True), ({"include_usage": False}, False), (None, False)]
)
def test_stream_options_follow_vllm_defaults(app: Any, opts: Any, usage: bool) -> None:
    req = chat(stream=True) if opts is None else chat(stream=True, stream_options=opts)
    evs = events(call(app, "POST", "/v1/chat/completions", req))
    assert (evs[-2]["choices"] == []) is usage


def test_empty_stream_options_without_stream_pass_vllms_falsy_check(app: Any) -> None:
    assert call(app, "POST", "/v1/chat/completions", chat(stream_options={})).status_code == 200


@pytest.mark.parametrize(
    "path, body, message",
    [
        (
            "/v1/chat/completions",
            chat(stream_options={"include_usage": True}),
            "Stream options can only be defined when `stream=True`.",
        ),
        ("/v1/chat/completions", {"model": "m"}, "Field required: `messages`"),
        (
            "/v1/completions",
            {"model": "m"},
            "At least one of `prompt` or `prompt_embeds` must be set.",
        ),
        ("/v1/chat/completions", chat(n=0), "n must be at least 1, got 0."),
        (
            "/v1/completions",
            {"prompt": "x", "max_tokens": 0},
            "max_tokens must be at least 1, got 0.",
        ),
        ("/v1/chat/completions", chat(temperature=-1), "temperature must be non-negative, got -1."),
        # vLLM sampling_params.py SamplingParams._verify_args: the ranges and the empty stop
        ("/v1/chat/completions", chat(top_p=0), "top_p must be in (0, 1], got 0."),
        ("/v1/completions", {"prompt": "x", "top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
        ("/v1/chat/completions", chat(presence_penalty=3),
         "presence_penalty must be in [-2, 2], got 3."),
        ("/v1/chat/completions", chat(frequency_penalty=-2.5),
         "frequency_penalty must be in [-2, 2], got -2.5."),
        ("/v1/chat/completions", chat(stop=""), "stop cannot contain an empty string."),
        ("/v1/completions", {"prompt": "x", "stop": ["a", ""]},
         "stop cannot contain an empty string."),
        (
            "/v1/chat/completions",
            chat(top_logprobs=2),
            "when using `top_logprobs`, `logprobs` must be set to true.",
        ),
        (
            "/v1/chat/completions",
            chat(tool_choice="auto"),
            "When using `tool_choice`, `tools` must be set.",
        ),
        (
            "/v1/chat/completions",
            chat(max_tokens=9000),
            "This model's maximum context length is 8192",
        ),
        ("/v1/chat/completions", chat("[[sim tokns=1]]"), "unknown simulator directive `tokns`"),
    ],
)
def test_validation_errors_use_vllm_body(app: Any, path: str, body: Any, message: str) -> None:
    resp = call(app, "POST", path, body)
    assert resp.status_code == 400 and resp.headers["content-type"] == "application/json"
    err = resp.json()["error"]
    assert list(err) == ["message", "type", "param", "code"]
    assert err["message"].startswith(message) and err["type"] == "BadRequestError"
    assert (err["param"], err["code"]) == (None, 400)


def test_bad_json_is_a_400(app: Any) -> None:
    resp = call(app, "POST", "/v1/chat/completions", raw=b"{not json")
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "BadRequestError"


def test_unknown_model_is_vllms_404_and_first_served_name_is_reported() -> None:
    app = build_app(SimulatorSettings(model_names=("a", "b")))
    resp = call(app, "POST", "/v1/chat/completions", chat() | {"model": "x"})
    assert resp.status_code == 404
    assert resp.content == (
        b'{"error":{"message":"The model `x` does not exist.",'
        b'"type":"NotFoundError","param":"model","code":404}}'
    )
    assert call(app, "POST", "/v1/chat/completions", chat() | {"model": "b"}).json()["model"] == "a"
    models = call(app, "GET", "/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["a", "b"]
    assert models["data"][0]["owned_by"] == "vllm" and models["data"][0]["permission"]


def test_health_unknown_path_and_method(app: Any) -> None:
    health = call(app, "GET", "/health")
    assert (health.status_code, health.content) == (200, b"")
    assert call(app, "GET", "/nope").status_code == 404
    assert call(app, "GET", "/v1/chat/completions").status_code == 405


def test_last_request_and_stats_and_reset(app: Any) -> None:
    call(
        app, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, headers={"X-Trace": "t"}
    )
    last = call(app, "GET", "/_sim/last_request").json()
    assert last["path"] == "/v1/completions" and last["headers"]["x-trace"] == "t"
    assert last["body"] == {"prompt": "hi", "max_tokens": 2}
    stats = call(app, "GET", "/_sim/stats").json()
    assert (stats["requests"], stats["completed"], stats["active"], stats["aborted"]) == (
        1,
        1,
        0,
        0,
    )
    assert call(app, "POST", "/_sim/reset").json()["requests"] == 0


def test_fail_times_then_success(app: Any) -> None:
    req = chat("[[sim fail=503 fail_times=1]]")
    first = call(app, "POST", "/v1/chat/completions", req)
    assert first.status_code == 503
    assert first.json()["error"]["type"] == "ServiceUnavailableError"
    assert call(app, "POST", "/v1/chat/completions", req).status_code == 200
    call(app, "POST", "/_sim/reset")
    assert call(app, "POST", "/v1/chat/completions", req).status_code == 503


def test_n_greedy_choices_are_identical_sampled_ones_differ(app: Any) -> None:
    greedy = call(app, "POST", "/v1/chat/completions", chat(n=2, temperature=0)).json()["choices"]
    assert greedy[0]["message"]["content"] == greedy[1]["message"]["content"]
    sampled = call(app, "POST", "/v1/chat/completions", chat(n=2, temperature=0.7)).json()[
        "choices"
    ]
    assert [c["index"] for c in sampled] == [0, 1]
    assert sampled[0]["message"]["content"] != sampled[1]["message"]["content"]
    seeded = call(app, "POST", "/v1/chat/completions", chat(temperature=0.7, seed=5)).json()
    assert seeded["choices"][0]["message"]["content"] != sampled[0]["message"]["content"]


def test_tool_call_non_stream_and_json_response_format(app: Any) -> None:
    tools = [
        {"type": "function", "function": {"name": "a", "parameters": {"properties": {"x": {}}}}},
        {"type": "function", "function": {"name": "b", "parameters": {"properties": {"y": {}}}}},
    ]
    body = call(
        app,
        "POST",
        "/v1/chat/completions",
        chat(tools=tools, tool_choice={"type": "function", "function": {"name": "b"}}),
    ).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call_,) = choice["message"]["tool_calls"]
    assert list(call_) == ["id", "type", "function"] and call_["function"]["name"] == "b"
    assert list(orjson.loads(call_["function"]["arguments"])) == ["y"]
    none = call(app, "POST", "/v1/chat/completions", chat(tools=tools, tool_choice="none")).json()
    assert none["choices"][0]["message"]["tool_calls"] == []
    js = call(
        app, "POST", "/v1/chat/completions", chat(response_format={"type": "json_object"})
    ).json()
    assert isinstance(orjson.loads(js["choices"][0]["message"]["content"]), dict)


def test_directive_in_any_message_and_stop_token_ids_and_ignore_eos(app: Any) -> None:
    msgs = [
        {"role": "system", "content": "[[sim tokens=2]]"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    short = call(app, "POST", "/v1/chat/completions", {"messages": msgs}).json()
    assert short["usage"]["completion_tokens"] == 3  # 2 words + EOS
    ids = call(app, "POST", "/v1/completions", {"prompt": "p", "return_token_ids": True}).json()
    second = ids["choices"][0]["token_ids"][1]
    stopped = call(app, "POST", "/v1/completions", {"prompt": "p", "stop_token_ids": [second]})
    choice = stopped.json()["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", second)
    long = call(
        app, "POST", "/v1/completions", {"prompt": "p", "ignore_eos": True, "max_tokens": 30}
    )
    assert long.json()["usage"]["completion_tokens"] == 30
    assert long.json()["choices"][0]["finish_reason"] == "length"


_VALUES = st.sampled_from(
    [
        None,
        True,
        0,
        -1,
        3,
        2.5,
        "x",
        "",
        [],
        {},
        [1, 2],
        ["a"],
        [[1]],
        {"a": 1},
        {"type": "json_schema", "json_schema": 5},
        {"function": 5},
        [{"function": {"name": "f"}}],
        [{"role": "user", "content": "hi"}],
        "[[sim tokens=2]]",
        "[[sim bogus]]",
    ]
)
_KEYS = st.sampled_from(
    [
        "messages",
        "prompt",
        "model",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "stream_options",
        "stop",
        "stop_token_ids",
        "logprobs",
        "top_logprobs",
        "tools",
        "tool_choice",
        "response_format",
        "temperature",
        "seed",
        "echo",
        "ignore_eos",
        "return_token_ids",
        "chat_template_kwargs",
        "min_tokens",
        "request_id",
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    body=st.dictionaries(_KEYS, _VALUES, max_size=8),
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
)
def test_any_body_gets_an_answer_or_a_vllm_error(body: dict[str, Any], path: str) -> None:
    """Arbitrary field values never crash the worker: 200, or 400/404 in vLLM's error shape."""
    resp = call(build_app(SimulatorSettings(tokens=2)), "POST", path, body)
    assert resp.status_code in (200, 400, 404)
    if resp.status_code != 200:
        assert list(resp.json()["error"]) == ["message", "type", "param", "code"]


def test_return_tokens_as_token_ids_names_every_logprob_token_by_id(app: Any) -> None:
    """vLLM `return_tokens_as_token_ids` (serving_engine.py _get_decoded_token): logprob
    token strings are `token_id:N`. Completions: `text_offset` counts those strings
    (serving_completion.py _create_completion_logprobs); chat: the sampled token's `bytes`
    stay its text's, an alternative's are its placeholder's."""
    plain = call(app, "POST", "/v1/completions", {
        "model": "m", "prompt": "hi", "logprobs": 1, "max_tokens": 2}).json()
    as_ids = call(app, "POST", "/v1/completions", {
        "model": "m", "prompt": "hi", "logprobs": 1, "max_tokens": 2, "return_token_ids": True,
        "return_tokens_as_token_ids": True}).json()
    choice, lp = as_ids["choices"][0], as_ids["choices"][0]["logprobs"]
    assert choice["text"] == plain["choices"][0]["text"]
    assert lp["tokens"] == [f"token_id:{i}" for i in choice["token_ids"]]
    assert lp["text_offset"] == [0, len(lp["tokens"][0])]
    assert all(set(top) >= {t} and all(k.startswith("token_id:") for k in top)
               for t, top in zip(lp["tokens"], lp["top_logprobs"], strict=True))
    chat_lp = call(app, "POST", "/v1/chat/completions", chat(
        logprobs=True, top_logprobs=2, max_tokens=1, return_token_ids=True,
        return_tokens_as_token_ids=True)).json()["choices"][0]
    entry = chat_lp["logprobs"]["content"][0]
    assert entry["token"] == f"token_id:{chat_lp['token_ids'][0]}"
    assert bytes(entry["bytes"]).decode() == chat_lp["message"]["content"]
    assert [bytes(a["bytes"]).decode() for a in entry["top_logprobs"]] == [
        a["token"] for a in entry["top_logprobs"]]


@pytest.mark.parametrize(("k", "entries"), [(0, 1), (1, 1), (3, 3)])
def test_completions_top_logprobs_hold_k_entries_when_the_sampled_token_is_among_them(
        app: Any, k: int, entries: int) -> None:
    """vLLM serving_completion.py `_create_completion_logprobs` keeps entries `i <= k` of a
    step's dict, which v1/engine/logprobs.py `_make_logprob_dict` builds from the sampled token
    and the top k by id, so a sampled token among the top k is listed once: k entries (1 for
    k = 0); k + 1 only when it ranks below them. The simulator samples the most likely token."""
    body = call(app, "POST", "/v1/completions",
                {"prompt": "Say", "logprobs": k, "max_tokens": 3}).json()
    lp = body["choices"][0]["logprobs"]
    assert [len(d) for d in lp["top_logprobs"]] == [entries] * 3
    assert [next(iter(d)) for d in lp["top_logprobs"]] == lp["tokens"]
