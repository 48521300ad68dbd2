"""Differential: TGI's own clients and bytes against the TGI fake direct and against the gateway.

SPEC: teams leaving TGI change only the base URL. The same request goes to the TGI fake
(tests/fakes/tgi_fake.py, TGI v3.3.7's router formats) and to the gateway's TGI front end before
each worker kind: `tgi` (that fake), `vllm` (the simulator) and `trtllm` (its fake). Before the
tgi worker the answer must be the fake's, byte for byte but for `created` and `model`; before
the others the same shape (keys and their order, types, token counts, finish reasons, framing),
with the text, token ids, log probs and prompt counts each worker makes its own. What a worker
cannot do is TGI's 422 validation error naming the field (SPEC "Worker protocols").

Validation is not judged by the fake, which checks with the gateway's own port of
validation.rs: each refusal below carries the message TGI's real code writes (router/src @
v3.3.7: validation.rs `validate` / `validate_best_of` and ValidationError, infer/mod.rs
generate_best_of and InferError, server.rs generate_stream_internal and From<InferError>).

Deliberate differences, not asserted as equal (their reasons):
- `adapter_id` names a gateway model; an unknown one is a 404 (SPEC "Unknown model: 404").
  TGI's shard falls back to the base model (flash_causal_lm.py `ADAPTER_TO_INDEX.get(id, 0)`).
- A `max_new_tokens` past the worker's context is refused by a vLLM or trtllm worker (422 with
  its message); TGI checks at most 1024 new tokens (validation.rs DEFAULT_GENERATION_LENGTH)
  and re-queues the rest, so it accepts. The gateway does not know the worker's context.
- The chat API takes `stop` as a string too (the OpenAI reading, tgi_chat.check); TGI's
  ChatRequest (`Option<Vec<String>>`) refuses it with axum's plain-text 422.
- A `grammar` whose value has the wrong JSON type (regex `5`, json_schema without `schema`)
  is the 422 JSON validation error "grammar is not supported"; TGI's serde refuses it earlier
  with axum's plain-text 422 (lib.rs GrammarType, JsonSchemaConfig).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub import errors as hf_errors

from tests.integration import procs

pytestmark = pytest.mark.integration

BACKENDS = ("tgi", "vllm", "trtllm")
SIDES = ("direct", *BACKENDS)
PROMPT = "What is Deep Learning?"
MSGS = [{"role": "user", "content": "What is 6x7?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
# Values each worker makes its own (masked by their type); `id` is a token id or a tool call id.
VARYING = {"text", "id", "logprob", "generated_text", "content", "token", "arguments",
           "input_length", "prompt_tokens", "total_tokens", "created", "model"}


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The TGI fake, the simulator, the trtllm fake, and a gateway before each; by PID."""
    tmp = tmp_path_factory.mktemp("diff-tgi")
    started: list[procs.Proc] = []
    try:
        ports = {}
        for name, module in (("tgi", "tests.fakes.tgi_fake"), ("trtllm", "tests.fakes.trtllm_fake")):
            ports[name] = procs.free_port()
            started.append(procs.Proc([sys.executable, "-m", module, str(ports[name])],
                                      tmp / f"{name}.log"))
        sim, sim_url = procs.simulator(tmp, "--tokens", "8")
        started.append(sim)
        ups = {"tgi": f"http://127.0.0.1:{ports['tgi']}", "vllm": sim_url,
               "trtllm": f"http://127.0.0.1:{ports['trtllm']}"}
        started[0].wait_http(ups["tgi"] + "/health")
        started[1].wait_http(ups["trtllm"] + "/health")
        urls = {"direct": ups["tgi"]}
        for kind in BACKENDS:
            extra = {} if kind == "tgi" else {"upstream_model": "org/m"}
            gw, urls[kind] = procs.gateway(tmp, orjson.dumps({
                "server": {"timeouts": {"first_byte": 10, "idle": 5}}, "default_model": "m",
                "models": [{"name": "m", "backend": kind, **extra, "upstreams": [ups[kind]]}],
            }).decode())
            started.append(gw)
        yield urls
    finally:
        for p in reversed(started):
            p.stop()


# ---- normalising ----


def plain(obj: Any) -> Any:
    """An SDK's answer (huggingface_hub dataclasses, text-generation pydantic models) as JSON
    values; dict key order is the field order."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "model_dump"):
        return plain(obj.model_dump())
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    return obj.value if hasattr(obj, "value") and not isinstance(obj, str | int) else obj


def mask(v: Any, exact: bool, key: str = "", also: frozenset[str] = frozenset()) -> Any:
    """`v` with what differs per worker (VARYING and `also`) replaced by its type name (only
    `created` and `model` when `exact`): keys stay in order, so field order is compared too."""
    if isinstance(v, dict):
        return [(k, mask(x, exact, k, also)) for k, x in v.items()]
    if isinstance(v, list):
        items = [mask(x, exact, "", also) for x in v]
        if key == "prefill" and not exact:  # the prompt's tokens: each worker tokenizes it
            return sorted({orjson.dumps(x) for x in items[1:]}) + items[:1]
        return items
    if isinstance(v, str) and not key and not exact:  # a text alone (an SDK's answer)
        return "str", v.startswith(PROMPT)  # compat_generate: return_full_text by default
    if key in ("created", "model") or (key in VARYING | also and not exact):
        return type(v).__name__
    return v


def body_of(r: httpx.Response) -> Any:
    """A JSON body, or an SSE stream as its events (each checked for `data: ` framing)."""
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        return r.json() if r.content else None
    assert r.text.endswith("\n\n"), r.text
    events = r.text[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), r.text
    return [e[6:] if e == "data: [DONE]" else orjson.loads(e[6:]) for e in events]


def post(url: str, path: str, body: Any) -> tuple[int, Any]:
    r = httpx.post(url + path, json=body, timeout=20)
    return r.status_code, body_of(r)


# ---- byte level: the same requests, each answer against the fake's ----

GEN = {"max_new_tokens": 3}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "generate": ("/generate", {"inputs": PROMPT, "parameters": GEN}),
    "generate_no_parameters": ("/generate", {"inputs": PROMPT}),
    "generate_details": ("/generate", {"inputs": PROMPT, "parameters": {**GEN, "details": True}}),
    "generate_prefill_top_tokens": ("/generate", {"inputs": PROMPT, "parameters": {
        **GEN, "details": True, "decoder_input_details": True, "top_n_tokens": 2}}),
    "generate_best_of": ("/generate", {"inputs": PROMPT, "parameters": {
        **GEN, "best_of": 2, "do_sample": True, "details": True}}),
    "generate_seed_full_text": ("/generate", {"inputs": PROMPT, "parameters": {
        **GEN, "seed": 7, "do_sample": True, "details": True, "return_full_text": True}}),
    "generate_grammar_json": ("/generate", {"inputs": PROMPT, "parameters": {
        **GEN, "grammar": {"type": "json", "value": SCHEMA}}}),
    "generate_grammar_regex": ("/generate", {"inputs": PROMPT, "parameters": {
        **GEN, "grammar": {"type": "regex", "value": "[a-z ]+"}}}),
    "generate_penalties_truncate": ("/generate", {"inputs": PROMPT, "parameters": {
        **GEN, "repetition_penalty": 1.2, "frequency_penalty": 0.5, "truncate": 10}}),
    "generate_typical_p": ("/generate", {"inputs": PROMPT, "parameters": {
        **GEN, "typical_p": 0.5}}),
    "generate_watermark": ("/generate", {"inputs": PROMPT, "parameters": {
        **GEN, "watermark": True}}),
    "stream": ("/generate_stream", {"inputs": PROMPT, "parameters": GEN}),
    "stream_details_top_tokens": ("/generate_stream", {"inputs": PROMPT, "parameters": {
        **GEN, "details": True, "top_n_tokens": 2}}),
    "compat_whole": ("/", {"inputs": PROMPT, "parameters": GEN}),
    "compat_stream": ("/", {"inputs": PROMPT, "parameters": {**GEN, "details": True},
                            "stream": True}),
    "chat": ("/v1/chat/completions", {"model": "tgi", "messages": MSGS, "max_tokens": 3}),
    "chat_stream_usage_logprobs": ("/v1/chat/completions", {
        "model": "tgi", "messages": MSGS, "max_tokens": 3, "stream": True, "logprobs": True,
        "top_logprobs": 2, "stream_options": {"include_usage": True}}),
    "chat_tools": ("/v1/chat/completions", {"model": "tgi", "messages": MSGS, "tools": TOOLS}),
}
# (backend, case): the field the worker cannot honour (TGI's 422 naming it).
REFUSED = {
    ("trtllm", "generate_prefill_top_tokens"): "prompt_logprobs",
    ("vllm", "generate_typical_p"): "typical_p", ("trtllm", "generate_typical_p"): "typical_p",
    ("vllm", "generate_watermark"): "watermark", ("trtllm", "generate_watermark"): "watermark",
}
# What else a worker makes its own in a case: the length of its tool call's arguments.
ALSO = {"chat_tools": frozenset({"completion_tokens"})}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_bytes_match_the_tgi_fake(sides: dict[str, str], case: str, backend: str) -> None:
    """Status, media type, field order, framing and values (TGI router lib.rs / server.rs /
    chat.rs formats, as the fake writes them) of the gateway's answer against the fake's."""
    path, body = CASES[case]
    status, want = post(sides["direct"], path, body)
    got_status, got = post(sides[backend], path, body)
    if (backend, case) in REFUSED:
        field = REFUSED[backend, case]
        assert (got_status, got) == (422, {
            "error": f"Input validation error: `{field}` is not supported by this model's worker",
            "error_type": "validation"})
        return
    assert got_status == status == 200
    also = ALSO.get(case, frozenset())
    assert mask(got, backend == "tgi", "", also) == mask(want, backend == "tgi", "", also)


def test_info_and_health_match(sides: dict[str, str]) -> None:
    """server.rs get_model_info (lib.rs Info, its order) and health (200, empty)."""
    want = httpx.get(sides["direct"] + "/info", timeout=5).json()
    for backend in BACKENDS:
        got = httpx.get(sides[backend] + "/info", timeout=5).json()
        assert list(got) == list(want)
        assert {k: v for k, v in got.items() if k not in ("model_id", "max_concurrent_requests")} \
            == {k: v for k, v in want.items() if k not in ("model_id", "max_concurrent_requests")}
        health = httpx.get(sides[backend] + "/health", timeout=5)
        assert (health.status_code, health.content) == (200, b"")


# ---- refusals: TGI's real messages (validation.rs ValidationError, InferError's prefix) ----

STREAM, WHOLE = "/generate_stream", "/generate"
INVALID: list[tuple[str, dict[str, Any], str]] = [
    (STREAM, {"best_of": 2, "do_sample": True},
     "`best_of` != 1 is not supported when streaming tokens"),  # server.rs, before validate
    (STREAM, {"decoder_input_details": True},
     "`decoder_input_details` == true is not supported when streaming tokens"),
    (WHOLE, {"best_of": 2}, "you must use sampling when `best_of` is > 1"),
    # infer/mod.rs generate_best_of: validate_best_of runs before validate's checks.
    (WHOLE, {"best_of": 3}, "`best_of` must be > 0 and <= 2. Given: 3"),
    (WHOLE, {"best_of": 3, "do_sample": True, "seed": 1}, "`best_of` must be > 0 and <= 2. Given: 3"),
    (WHOLE, {"best_of": 2, "do_sample": True, "seed": 1}, "`seed` must not be set when `best_of` > 1"),
    (WHOLE, {"temperature": 0}, "`temperature` must be strictly positive"),
    (STREAM, {"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
    (WHOLE, {"typical_p": 0.0}, "`typical_p` must be > 0.0 and < 1.0"),
    (WHOLE, {"top_k": 0}, "`top_k` must be strictly positive"),
    (WHOLE, {"repetition_penalty": 0}, "`repetition_penalty` must be strictly positive"),
    (WHOLE, {"frequency_penalty": 3}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    (STREAM, {"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
    (WHOLE, {"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5"),
    (WHOLE, {"top_n_tokens": 6}, "`top_n_tokens` must be >= 0 and <= 5. Given: 6"),
    (WHOLE, {"truncate": 0}, "`truncate` must be strictly positive and less than 4095. Given: 0"),
    (STREAM, {"truncate": 5000},
     "`truncate` must be strictly positive and less than 4095. Given: 5000"),
    (WHOLE, {"grammar": {"type": "json", "value": {"type": "object"}}},
     "grammar is not valid: Grammar must have a 'properties' field"),
    (WHOLE, {"grammar": {"type": "json", "value": 5}}, "grammar is not supported"),
]


@pytest.mark.parametrize(("path", "params", "message"), INVALID, ids=[m for _, _, m in INVALID])
def test_invalid_input_is_refused_as_tgi_refuses(sides: dict[str, str], path: str,
                                                 params: dict[str, Any], message: str) -> None:
    """server.rs From<InferError>: 422 `{"error","error_type":"validation"}`; a stream answers
    HTTP 200 and the same object as its one event (generate_stream_internal)."""
    body = {"error": f"Input validation error: {message}", "error_type": "validation"}
    want = (200, [body]) if path == STREAM else (422, body)
    for side in SIDES:
        assert post(sides[side], path, {"inputs": PROMPT, "parameters": params}) == want, side
    empty = {"error": "Input validation error: `inputs` cannot be empty", "error_type": "validation"}
    for side in SIDES:
        assert post(sides[side], WHOLE, {"inputs": ""}) == (422, empty), side


def test_chat_refusals_match(sides: dict[str, str]) -> None:
    """chat_completions hands try_into_generate's request to validate: 422 ErrorResponse, or in
    a stream infer/mod.rs into_openai_event (http_status_code 422) then `data: [DONE]`."""
    top_p = {"error": "Input validation error: `top_p` must be > 0.0 and < 1.0",
             "error_type": "validation"}
    over = {"error": {"message": "Input validation error: `top_n_tokens` must be >= 0 and <= 5. "
                                 "Given: 9", "http_status_code": 422}}
    for side in SIDES:
        chat = {"model": "tgi", "messages": MSGS}
        assert post(sides[side], "/v1/chat/completions", {**chat, "top_p": 1.0}) == (422, top_p)
        assert post(sides[side], "/v1/chat/completions", {
            **chat, "stream": True, "logprobs": True, "top_logprobs": 9}) == (
            200, [over, "[DONE]"]), side


# ---- client level: what the SDKs return or raise ----

HF_CALLS: dict[str, dict[str, Any]] = {
    "plain": {},
    "details": {"details": True},
    "stream": {"stream": True},
    "stream_details": {"stream": True, "details": True, "top_n_tokens": 2},
    "prefill": {"details": True, "decoder_input_details": True},
    "best_of": {"details": True, "best_of": 2, "do_sample": True},
    "grammar_regex": {"details": True, "grammar": {"type": "regex", "value": "[a-z ]+"}},
    "grammar_json": {"grammar": {"type": "json", "value": SCHEMA}},
    "stop_seed_full": {"details": True, "stop": ["zzz"], "seed": 5, "do_sample": True,
                       "return_full_text": True, "truncate": 10},
    "penalties": {"repetition_penalty": 1.1, "frequency_penalty": 0.2, "temperature": 0.7},
    "typical_p": {"typical_p": 0.5},
    "watermark": {"watermark": True},
}
HF_REFUSED = {("trtllm", "prefill"): "prompt_logprobs", ("vllm", "typical_p"): "typical_p",
              ("trtllm", "typical_p"): "typical_p", ("vllm", "watermark"): "watermark",
              ("trtllm", "watermark"): "watermark"}


def hf_text(url: str, kwargs: dict[str, Any]) -> Any:
    client = InferenceClient(base_url=url, timeout=20)  # held: its streams close with it
    out = client.text_generation(PROMPT, max_new_tokens=3, **kwargs)
    return plain(list(out) if kwargs.get("stream") else out)


@pytest.mark.parametrize("call", sorted(HF_CALLS))
def test_huggingface_hub_text_generation_agrees(sides: dict[str, str], call: str) -> None:
    """huggingface_hub InferenceClient.text_generation (POST /, inference/_client.py): the same
    type, fields, token list shapes and finish reasons as against TGI (the fake)."""
    kwargs = HF_CALLS[call]
    want = hf_text(sides["direct"], kwargs)
    for backend in BACKENDS:
        if (backend, call) in HF_REFUSED:
            with pytest.raises(hf_errors.ValidationError,
                               match=f"`{HF_REFUSED[backend, call]}` is not supported"):
                hf_text(sides[backend], kwargs)
            continue
        got = hf_text(sides[backend], kwargs)
        assert mask(got, backend == "tgi") == mask(want, backend == "tgi"), backend


def test_huggingface_hub_errors_agree(sides: dict[str, str]) -> None:
    """raise_text_generation_error (_common.py): the same exception class and message."""
    for kwargs in ({"top_p": 1.0}, {"stream": True, "top_p": 1.0}, {"best_of": 3}):
        seen = set()
        for side in SIDES:
            with pytest.raises(hf_errors.TextGenerationError) as exc:
                hf_text(sides[side], kwargs)
            seen.add((type(exc.value), str(exc.value)))
        assert len(seen) == 1, seen


HF_CHATS: dict[str, dict[str, Any]] = {
    "plain": {"max_tokens": 3, "seed": 3},
    "stream_usage": {"max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
    "logprobs": {"max_tokens": 3, "logprobs": True, "top_logprobs": 2},
    "stop": {"max_tokens": 3, "stop": ["zzz"]},
    "tools": {"tools": TOOLS, "tool_choice": "auto"},
    "response_format": {"max_tokens": 3, "response_format": {"type": "json", "value": SCHEMA}},
}


def hf_chat(url: str, kwargs: dict[str, Any]) -> Any:
    client = InferenceClient(base_url=url, timeout=20)
    out = client.chat_completion(MSGS, **kwargs)
    return plain(list(out) if kwargs.get("stream") else out)


@pytest.mark.parametrize("call", sorted(HF_CHATS))
def test_huggingface_hub_chat_completion_agrees(sides: dict[str, str], call: str) -> None:
    """huggingface_hub chat_completion (model "dummy" on /v1/chat/completions, SPEC TGI): the
    same output types and fields as TGI's Messages API (chat.rs / lib.rs ChatCompletion)."""
    want = hf_chat(sides["direct"], HF_CHATS[call])
    also = frozenset({"completion_tokens"}) if call in ("tools", "response_format") else \
        frozenset()
    for backend in BACKENDS:
        got = hf_chat(sides[backend], HF_CHATS[call])
        exact = backend == "tgi"
        assert mask(got, exact, "", also) == mask(want, exact, "", also), backend


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # its own pydantic `.dict()` calls
def test_text_generation_clients_agree(sides: dict[str, str]) -> None:
    """text-generation 0.7.0 Client / AsyncClient generate and generate_stream (POST /, always
    details): the same Response / StreamResponse fields."""
    import text_generation as tg

    async def both(url: str) -> Any:
        client = tg.AsyncClient(url, timeout=20)
        whole = await client.generate(PROMPT, max_new_tokens=3, best_of=2, do_sample=True)
        return whole, [r async for r in client.generate_stream(PROMPT, max_new_tokens=3)]

    def calls(url: str) -> Any:
        client = tg.Client(url, timeout=20)
        return plain([client.generate(PROMPT, max_new_tokens=3, decoder_input_details=True,
                                      top_n_tokens=2),
                      list(client.generate_stream(PROMPT, max_new_tokens=3, top_n_tokens=1)),
                      *asyncio.run(both(url))])

    want = calls(sides["direct"])
    for backend in ("tgi", "vllm"):  # trtllm: no prompt logprobs (decoder_input_details)
        assert mask(calls(sides[backend]), backend == "tgi") == mask(want, backend == "tgi")
    with pytest.raises(tg.errors.ValidationError, match="`prompt_logprobs` is not supported"):
        tg.Client(sides["trtllm"], timeout=20).generate(PROMPT, decoder_input_details=True)
