"""One request, every client protocol: the same worker request and the same answer.

Each client protocol is parsed into one canonical request and sent to the worker in its own
schema, so equivalent requests in OpenAI, TGI, LMI and Elastic form must reach a worker as the
same body (up to each protocol's documented defaults) and come back as the same answer: text,
finish reason in each protocol's names, token counts, tool calls. The workers are those of the
client x worker matrix, in process (tests/matrix/harness.py): the simulator (`vllm`, and
deterministic: the same prompt, seed and temperature give the same tokens) and the
`trtllm`, `triton` and `tgi` fakes.

Documented differences (asserted below wherever a request can show them; none is normalised
away, only whether the gateway streams from the worker):

| Difference | Protocols | Source |
|---|---|---|
| default max new tokens 30, greedy unless sampling is asked for | LMI `inputs` | seed 003; DJL vllm_rolling_batch.py translate_vllm_params |
| no `max_new_tokens`: as many tokens as fit (`max_tokens: null` to vLLM) | TGI /generate | TGI validation.rs validate_input |
| no `parameters` at all samples (`default_parameters` do_sample true) with a drawn seed; `parameters: {}` is greedy | TGI /generate | TGI lib.rs default_parameters, validation.rs |
| completions default 16 tokens (the worker's own) | OpenAI /v1/completions, LMI `prompt` | vLLM protocol.py CompletionRequest |
| chat: no limit, the worker's default | every chat protocol | vLLM protocol.py; DJL vllm_chat_utils.py |
| the matched stop string is kept: asked of vLLM / trtllm-serve (`include_stop_str_in_output`) for /generate, put back by the encoder for chat | TGI /generate, TGI chat | TGI StopSequenceCriteria; TGI issue #332 |
| a stream carries an id and logprob per token (`logprobs`, `return_token_ids` asked) | TGI /generate_stream, LMI `inputs` stream | TGI server.rs StreamResponse; seed 003 Token |
| no seed, no top_k, no penalties | Elastic chat | Elasticsearch UnifiedCompletionRequest.PARSER |
| finish names: stop/length/tool_calls; eos_token/stop_sequence/length; stop/stop_sequence/length | OpenAI + Elastic; TGI generate + LMI; TGI chat | wire-formats.md section 9; TGI lib.rs FinishReason |
| the completion task is a chat turn of the `input` | Elastic completion | Elasticsearch OpenAiChatCompletionRequestEntity |
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest

from gateway import app as gateway_app
from gateway import upstream, upstream_clients
from tests.matrix import harness

KINDS = ("vllm", "trtllm", "triton", "tgi")
Body = dict[str, Any]


class Capture(harness.Fakes):
    """The matrix's in-process workers, recording each request body they are sent."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, Body]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.seen.append((request.url.path, orjson.loads(await request.aread())))
        return await super().handle_async_request(request)


class Gateway:
    """One gateway app in front of one worker kind, and what its worker was sent."""

    def __init__(self, client: httpx.AsyncClient, workers: Capture):
        self.client, self.workers = client, workers

    async def post(self, path: str, body: Body) -> httpx.Response:
        r = await self.client.post(path, content=orjson.dumps(body),
                                   headers={"content-type": "application/json"})
        assert r.status_code == 200, (path, r.content)
        return r

    async def worker_body(self, path: str, body: Body) -> tuple[str, Body]:
        """The one worker request `body` on `path` made, its stream flags left out (whether
        the gateway streams from the worker is its own choice, not the client's)."""
        start = len(self.workers.seen)
        await self.post(path, body)
        assert len(self.workers.seen) == start + 1
        wpath, wbody = self.workers.seen[-1]
        wbody = {k: v for k, v in wbody.items() if k not in ("stream", "stream_options")}
        return wpath.removesuffix("_stream"), wbody


@asynccontextmanager
async def gateway(kind: str) -> AsyncIterator[Gateway]:
    workers = Capture()

    def factory(_: Any) -> upstream.UpstreamClient:
        return upstream_clients.HttpxClient(httpx.AsyncClient(transport=workers, timeout=20))

    app = gateway_app.build_app(harness.make_config(kind, ""), factory)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw", timeout=30) as client:
            yield Gateway(client, workers)


# ---- worker requests ----

MSGS = [{"role": "user", "content": "Say something"}]
CHAT = {"temperature": 0.5, "top_p": 0.9, "stop": ["zz"]}

# The same chat request in every chat protocol: 5 tokens, temperature, top_p, a stop string.
CHAT_ROWS: dict[str, tuple[str, Body]] = {
    "openai": ("/v1/chat/completions", {"model": "m", "messages": MSGS, "max_tokens": 5, **CHAT}),
    "openai max_completion_tokens": ("/v1/chat/completions", {
        "model": "m", "messages": MSGS, "max_completion_tokens": 5, **CHAT}),
    "openai stream": ("/v1/chat/completions", {
        "model": "m", "messages": MSGS, "max_tokens": 5, "stream": True, **CHAT}),
    "lmi messages": ("/invocations", {"messages": MSGS, "max_tokens": 5, **CHAT}),
    "lmi messages stream": ("/invocations", {
        "messages": MSGS, "max_tokens": 5, "stream": True, **CHAT}),
    "elastic _stream": ("/_inference/chat_completion/m/_stream", {
        "messages": MSGS, "max_completion_tokens": 5, **CHAT}),
    "elastic _unified": ("/_inference/m/_unified", {
        "messages": MSGS, "max_completion_tokens": 5, **CHAT}),
    "elastic whole": ("/_inference/chat_completion/m", {
        "messages": MSGS, "max_completion_tokens": 5, **CHAT}),
}
# A TGI client's chat: the same body too; TGI keeps the matched stop string in its text, which
# its encoder puts back after the worker stripped it (tgi_encode.with_stop), as the answers show.
TGI_CHAT = ("/v1/chat/completions", {"model": "tgi", "messages": MSGS, "max_tokens": 5, **CHAT})

# The same text request in every text protocol, sampling: 5 tokens, temperature, top_p, top_k,
# seed, a stop string, repetition and frequency penalties.
TEXT = {"temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 7, "repetition_penalty": 1.2,
        "frequency_penalty": 0.4}
TGI_PARAMS = {"max_new_tokens": 5, "stop": ["zz"], **TEXT}
LMI_PARAMS = {"max_new_tokens": 5, "stop_sequences": ["zz"], **TEXT}
OPENAI_TEXT = {"prompt": "Say", "max_tokens": 5, "stop": ["zz"], **TEXT}

# row -> (path, body, documented additions: "keep_stop" and / or "per_token")
TEXT_ROWS: dict[str, tuple[str, Body, tuple[str, ...]]] = {
    "openai": ("/v1/completions", {"model": "m", **OPENAI_TEXT}, ()),
    "openai stream": ("/v1/completions", {"model": "m", "stream": True, **OPENAI_TEXT}, ()),
    "lmi prompt": ("/invocations", OPENAI_TEXT, ()),
    "lmi inputs": ("/invocations", {"inputs": "Say", "parameters": LMI_PARAMS}, ()),
    "lmi inputs stream": ("/invocations", {"inputs": "Say", "stream": True,
                                           "parameters": LMI_PARAMS}, ("per_token",)),
    "tgi /generate": ("/generate", {"inputs": "Say", "parameters": TGI_PARAMS}, ("keep_stop",)),
    "tgi /generate_stream": ("/generate_stream", {"inputs": "Say", "parameters": TGI_PARAMS},
                             ("keep_stop", "per_token")),
    "tgi POST /": ("/", {"inputs": "Say", "parameters": {**TGI_PARAMS,
                                                         "return_full_text": False}},
                   ("keep_stop",)),
}

# What each documented addition is on each worker's wire (none where the worker does it anyway:
# TGI keeps stop strings and details every token; Triton keeps the stop word).
ADDITIONS: dict[str, dict[str, Body]] = {
    "keep_stop": {"vllm": {"include_stop_str_in_output": True},
                  "trtllm": {"include_stop_str_in_output": True}},
    "per_token": {"vllm": {"logprobs": 0, "return_token_ids": True},
                  "trtllm": {"logprobs": 1}},
}


def _added(kind: str, names: tuple[str, ...]) -> Body:
    out: Body = {}
    for name in names:
        out.update(ADDITIONS[name].get(kind, {}))
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_every_chat_protocol_sends_the_worker_the_same_request(kind: str) -> None:
    """OpenAI chat (both max-token names, stream or not), LMI `messages`, Elastic `_stream`,
    `_unified` and whole: one worker body. Sources: vLLM protocol.py ChatCompletionRequest
    (`max_completion_tokens` or `max_tokens`); DJL vllm_chat_utils.py (LMI chat is vLLM's
    ChatCompletionRequest); Elasticsearch UnifiedCompletionRequest (max_completion_tokens,
    temperature, top_p, stop) and OpenAiUnifiedChatCompletionRequestEntity."""
    async with gateway(kind) as gw:
        sent = {row: await gw.worker_body(path, body) for row, (path, body) in CHAT_ROWS.items()}
        sent["tgi chat"] = await gw.worker_body(*TGI_CHAT)
    reference = sent["openai"]
    assert {row: b for row, b in sent.items() if b != reference} == {}


@pytest.mark.anyio
@pytest.mark.parametrize("kind", KINDS)
async def test_every_text_protocol_sends_the_worker_the_same_request(kind: str) -> None:
    """OpenAI completions, LMI `prompt` and `inputs`, TGI /generate, /generate_stream and
    POST /: one worker body, plus each protocol's documented additions (ADDITIONS). Sources:
    DJL vllm_rolling_batch.py translate_vllm_params (max_new_tokens -> max_tokens,
    stop_sequences -> stop, seed as int, sampling kept when asked); TGI lib.rs
    GenerateParameters and validation.rs (its names are vLLM's but max_new_tokens; a stop
    sequence is kept in the text, StopSequenceCriteria)."""
    async with gateway(kind) as gw:
        sent = {row: (await gw.worker_body(path, body), extra)
                for row, (path, body, extra) in TEXT_ROWS.items()}
    (ref_path, ref_body), _ = sent["openai"]
    differences = {row: body for row, ((path, body), extra) in sent.items()
                   if (path, body) != (ref_path, ref_body | _added(kind, extra))}
    assert differences == {}


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
NAMED = {"type": "function", "function": {"name": "f"}}
HISTORY = [{"role": "user", "content": "Weather?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
           {"role": "user", "content": "And tomorrow?"}]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ("vllm", "trtllm", "tgi"))
async def test_tools_and_tool_turns_reach_the_worker_alike(kind: str) -> None:
    """Tools, a named tool choice and a tool-call history from OpenAI, LMI, Elastic and a TGI
    client (its bare-name tool choice, lib.rs ToolChoice): one worker body. Sources: vLLM
    protocol.py (tools, tool_choice object); Elasticsearch UnifiedCompletionRequest (tools,
    tool_choice object, tool messages); TGI lib.rs ChatRequest. (Triton refuses a required
    tool call from every protocol alike: its template's output is not parsed.)"""
    common = {"messages": HISTORY, "tools": TOOLS, "tool_choice": NAMED}
    rows = [("/v1/chat/completions", {"model": "m", "max_tokens": 5, **common}),
            ("/invocations", {"max_tokens": 5, **common}),
            ("/_inference/chat_completion/m", {"max_completion_tokens": 5, **common}),
            ("/_inference/chat_completion/m/_stream", {"max_completion_tokens": 5, **common}),
            ("/v1/chat/completions", {"model": "tgi", "max_tokens": 5, **common,
                                      "tool_choice": "f"})]
    async with gateway(kind) as gw:
        sent = [await gw.worker_body(path, body) for path, body in rows]
    assert sent[1:] == [sent[0]] * 4


# Each protocol's request with nothing but its prompt, and what its defaults send to vLLM:
# (path, body, the worker fields that say the defaults). `...`: present, any value.
DEFAULTS: dict[str, tuple[str, Body, Body]] = {
    "openai completions": ("/v1/completions", {"model": "m", "prompt": "Say"}, {}),
    "lmi prompt": ("/invocations", {"prompt": "Say"}, {}),
    "lmi inputs": ("/invocations", {"inputs": "Say"}, {"max_tokens": 30, "temperature": 0.0}),
    "tgi no parameters": ("/generate", {"inputs": "Say"}, {"max_tokens": None, "seed": ...}),
    "tgi empty parameters": ("/generate", {"inputs": "Say", "parameters": {}},
                             {"max_tokens": None, "temperature": 0.0}),
    "openai chat": ("/v1/chat/completions", {"model": "m", "messages": MSGS}, {}),
    "tgi chat": ("/v1/chat/completions", {"model": "tgi", "messages": MSGS}, {}),
    "lmi messages": ("/invocations", {"messages": MSGS}, {}),
    "elastic chat": ("/_inference/chat_completion/m", {"messages": MSGS}, {}),
    "elastic completion": ("/_inference/completion/m", {"input": "Say"}, {}),
}
DECODING = ("max_tokens", "temperature", "top_p", "top_k", "seed")


@pytest.mark.anyio
async def test_each_protocols_defaults_are_its_documented_ones() -> None:
    """The only decoding fields a bare request sends to vLLM are its protocol's documented
    defaults (this module's table): LMI's 30 tokens and greedy (seed 003, translate_vllm_params
    `max_new_tokens` default 30, temperature 0 without do_sample); TGI's "as many as fit" and
    default_parameters' sampling with a drawn seed (lib.rs, validation.rs); nothing elsewhere,
    so the worker's own defaults hold (vLLM protocol.py: 16 for completions, the context
    for chat)."""
    got: dict[str, Body] = {}
    async with gateway("vllm") as gw:
        for row, (path, body, _) in DEFAULTS.items():
            _, sent = await gw.worker_body(path, body)
            got[row] = {k: sent[k] for k in DECODING if k in sent}
    for row, (_, _, expected) in DEFAULTS.items():
        assert got[row].keys() == expected.keys(), row
        assert all(v is ... or got[row][k] == v for k, v in expected.items()), (row, got[row])
    assert isinstance(got["tgi no parameters"]["seed"], int)


# ---- answers ----

Answer = tuple[str, str, int | None]  # text, finish reason, generated tokens


def _sse(r: httpx.Response) -> list[Body]:
    return [orjson.loads(d) for d in harness.sse_data(r.content) if d != b"[DONE]"]


def _lines(r: httpx.Response) -> list[Body]:
    return [orjson.loads(x) for x in r.content.splitlines() if x.strip()]


def _chunks(chunks: list[Body], key: str) -> Answer:
    """An OpenAI-shaped stream: text joined, the finish reason, the usage chunk's count."""
    choices = [c for k in chunks for c in k["choices"]]
    text = "".join((c["delta"] if key == "content" else c).get(key) or "" for c in choices)
    finish = [c["finish_reason"] for c in choices if c.get("finish_reason")]
    usage = [k["usage"] for k in chunks if k.get("usage")]
    return text, finish[-1], usage[-1]["completion_tokens"] if usage else None


def openai_chat(r: httpx.Response) -> Answer:
    c = (o := orjson.loads(r.content))["choices"][0]
    return c["message"]["content"], c["finish_reason"], o["usage"]["completion_tokens"]


def openai_text(r: httpx.Response) -> Answer:
    c = (o := orjson.loads(r.content))["choices"][0]
    return c["text"], c["finish_reason"], o["usage"]["completion_tokens"]


def generated(r: httpx.Response) -> Answer:
    """TGI /generate and LMI `inputs` with details."""
    o = orjson.loads(r.content)
    return o["generated_text"], o["details"]["finish_reason"], o["details"]["generated_tokens"]


def generated_stream(events: list[Body]) -> Answer:
    """TGI /generate_stream and LMI `inputs` lines: the last one has the text and details."""
    d = events[-1]["details"]
    return events[-1]["generated_text"], d["finish_reason"], d["generated_tokens"]


Reader = Callable[[httpx.Response], Answer]
USAGE = {"stream_options": {"include_usage": True}}
ES_CHAT = "/_inference/chat_completion/m"

# protocol -> (path, body for (max tokens, stop), reader, finish names: eos, stop string, length)
CHAT_ANSWERS: dict[str, tuple[str, Callable[[int, list[str]], Body], Reader, tuple[str, ...]]] = {
    "openai": ("/v1/chat/completions", lambda n, s: {
        "model": "m", "messages": MSGS, "max_tokens": n, "stop": s, "temperature": 0},
        openai_chat, ("stop", "stop", "length")),
    "openai stream": ("/v1/chat/completions", lambda n, s: {
        "model": "m", "messages": MSGS, "max_tokens": n, "stop": s, "temperature": 0,
        "stream": True, **USAGE}, lambda r: _chunks(_sse(r), "content"),
        ("stop", "stop", "length")),
    "lmi messages": ("/invocations", lambda n, s: {
        "messages": MSGS, "max_tokens": n, "stop": s, "temperature": 0},
        openai_chat, ("eos_token", "stop_sequence", "length")),
    "lmi messages stream": ("/invocations", lambda n, s: {
        "messages": MSGS, "max_tokens": n, "stop": s, "temperature": 0, "stream": True},
        lambda r: _chunks(_lines(r), "content")[:2] + (None,),
        ("eos_token", "stop_sequence", "length")),
    "elastic whole": (ES_CHAT, lambda n, s: {
        "messages": MSGS, "max_completion_tokens": n, "stop": s, "temperature": 0},
        openai_chat, ("stop", "stop", "length")),
    "elastic _stream": (ES_CHAT + "/_stream", lambda n, s: {
        "messages": MSGS, "max_completion_tokens": n, "stop": s, "temperature": 0},
        lambda r: _chunks([e["chat_completion"] for e in _sse(r)], "content"),
        ("stop", "stop", "length")),
    "tgi chat": ("/v1/chat/completions", lambda n, s: {
        "model": "tgi", "messages": MSGS, "max_tokens": n, "stop": s, "temperature": 0},
        openai_chat, ("stop", "stop_sequence", "length")),
}

TEXT_ANSWERS: dict[str, tuple[str, Callable[[int, list[str]], Body], Reader, tuple[str, ...]]] = {
    "openai": ("/v1/completions", lambda n, s: {
        "model": "m", "prompt": "Say", "max_tokens": n, "stop": s, "temperature": 0},
        openai_text, ("stop", "stop", "length")),
    "openai stream": ("/v1/completions", lambda n, s: {
        "model": "m", "prompt": "Say", "max_tokens": n, "stop": s, "temperature": 0,
        "stream": True, **USAGE}, lambda r: _chunks(_sse(r), "text"),
        ("stop", "stop", "length")),
    "lmi prompt": ("/invocations", lambda n, s: {
        "prompt": "Say", "max_tokens": n, "stop": s, "temperature": 0},
        openai_text, ("stop", "stop", "length")),
    "lmi inputs": ("/invocations", lambda n, s: {"inputs": "Say", "parameters": {
        "max_new_tokens": n, "stop_sequences": s, "details": True}},
        generated, ("eos_token", "stop_sequence", "length")),
    "lmi inputs stream": ("/invocations", lambda n, s: {"inputs": "Say", "stream": True,
        "parameters": {"max_new_tokens": n, "stop_sequences": s, "details": True}},
        lambda r: generated_stream(_lines(r)), ("eos_token", "stop_sequence", "length")),
    "tgi /generate": ("/generate", lambda n, s: {"inputs": "Say", "parameters": {
        "max_new_tokens": n, "stop": s, "details": True}},
        generated, ("eos_token", "stop_sequence", "length")),
    "tgi /generate_stream": ("/generate_stream", lambda n, s: {"inputs": "Say", "parameters": {
        "max_new_tokens": n, "stop": s, "details": True}},
        lambda r: generated_stream(_sse(r)), ("eos_token", "stop_sequence", "length")),
}
# Protocols whose text keeps the matched stop string (TGI StopSequenceCriteria, issue #332).
KEEPS_STOP = {"tgi chat", "tgi /generate", "tgi /generate_stream"}


async def _answers(gw: Gateway, table: dict[str, Any], n: int,
                   stop: list[str]) -> dict[str, Answer]:
    out = {}
    for name, (path, make, read, _) in table.items():
        out[name] = read(await gw.post(path, make(n, stop)))
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("table", ["chat", "text"])
async def test_the_same_request_gets_the_same_answer_in_every_protocol(table: str) -> None:
    """Greedy on the simulator: a length cut, a natural end and a matched stop string give the
    same text and token count in every protocol, and the finish reason in each one's names
    (wire-formats.md section 9: OpenAI and Elastic `stop` / `length`; LMI and TGI generate
    `eos_token` / `stop_sequence` / `length`, seeds 000 and 003, TGI lib.rs FinishReason; TGI
    chat `stop_sequence` for a stop string). TGI keeps the matched stop string in its text
    (StopSequenceCriteria); OpenAI, vLLM, LMI and Elastic do not. LMI's chat stream carries
    no usage (DJL jsonlines_chat), so no count there."""
    rows = CHAT_ANSWERS if table == "chat" else TEXT_ANSWERS
    async with gateway("vllm") as gw:
        natural = await _answers(gw, rows, 200, [])
        cut = await _answers(gw, rows, 3, [])
        words = natural["openai"][0].split(" ")
        stop = " " + words[5]  # a word of the greedy answer, past the length cut
        stopped = await _answers(gw, rows, 200, [stop])
    full, count = natural["openai"][0], natural["openai"][2]
    assert count is not None and count > 4
    before_stop = full[:full.index(stop)]
    for name, (_, _, _, (eos, stop_name, length)) in rows.items():
        assert natural[name][:2] == (full, eos), name
        assert cut[name][:2] == (" ".join(words[:4]), length), name
        kept = stop if name in KEEPS_STOP else ""
        assert stopped[name][:2] == (before_stop + kept, stop_name), name
        if natural[name][2] is not None:
            assert (natural[name][2], cut[name][2]) == (count, 3), name


@pytest.mark.anyio
async def test_the_elastic_completion_task_answers_as_the_chat_turn_it_is() -> None:
    """Elasticsearch's `completion` task on an OpenAI-style service sends its `input` as one
    user message (OpenAiChatCompletionRequestEntity); `task_settings` carry max_tokens and
    temperature: the same text as that chat turn from OpenAI, whole and streamed."""
    settings = {"input": "Say something", "task_settings": {"max_tokens": 6, "temperature": 0}}
    async with gateway("vllm") as gw:
        chat = openai_chat(await gw.post("/v1/chat/completions", {
            "model": "m", "messages": MSGS, "max_tokens": 6, "temperature": 0}))
        whole = await gw.post("/_inference/completion/m", settings)
        streamed = await gw.post("/_inference/completion/m/_stream", settings)
    assert orjson.loads(whole.content)["completion"] == [{"result": chat[0]}]
    assert "".join(d["delta"] for e in _sse(streamed) for d in e["completion"]) == chat[0]
