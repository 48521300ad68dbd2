"""Differential: the same OpenAI request sent to a worker and through a gateway in front of it.

A client that moves from an OpenAI-protocol worker's URL to the gateway's must read the same
answers. Three workers run as processes: the simulator (kind `vllm`, vLLM 0.11's protocol) and
tests/fakes/trtllm_fake.py (kind `trtllm`, and the same fake as kind `openai`); one gateway
fronts all three. Each request goes to the worker directly and through the gateway, and both
answers are compared after tests/integration/openai_diff.py has normalised them (status, error
`param` where the worker names one, per-choice text, reasoning, tool calls, finish and stop
reasons, log probs, usage, and the stream's shape). Hand-written cases, then a bounded
hypothesis walk over the request space.

Where they differ on purpose (and the normaliser or the cases leave it out):

| What | Worker | Gateway | Why |
|---|---|---|---|
| error body | vLLM `type` "BadRequestError", `code` 400, `param` null; trtllm flat or a string | OpenAI's object: `invalid_request_error`, `code` a string, `param` the field | SPEC "Bad input": the OpenAI error object naming the field (openai-python ErrorObject) |
| null and empty keys | vLLM writes every optional key (`refusal`, `tool_calls: []`, `service_tier`, ...), trtllm on bodies and completions chunks (and `reasoning_content: ""`) | only the keys OpenAI's types carry | one OpenAI shape whatever the worker (schemas/openai.py response models) |
| usage key order | vLLM UsageInfo: prompt, total, completion | OpenAI's: prompt, completion, total | SPEC "Usage keys in the order the seed for that protocol shows" |
| finish chunk | vLLM / trtllm put `finish_reason` on the last token's chunk | a chunk of its own, `delta: {}` | events are kept apart (STYLE 2: Finish is its own event); both valid to openai-python |
| `usage: null` on chunks | absent (vLLM `exclude_unset`, trtllm `exclude_none`) | on every chunk when `include_usage` | OpenAI api-reference: "All other chunks will also include a usage field, but with a null value" |
| `temperature` > 2 | accepted (vLLM/trtllm check only >= 0) | 400 | OpenAI's range; tests/unit/test_tgi_params.py::test_named_models_stay_plain_openai |
| `messages: []` | answered (vLLM has no minimum) | 400 | OpenAI requires at least one message (schemas/openai.py `min_length=1`) |
| unknown field (kind `openai`) | the fake (trtllm) 400 | dropped with a log line | a plain OpenAI server's extras are unknown (tests/unit/test_openai_backend_params.py) |
| `"n": "2"` (a numeric string) | simulator 400 | coerced, as real vLLM's pydantic does | the simulator is stricter than vLLM (its int_field); not the gateway's fault |
| streamed echo `text_offset` | vLLM advances offsets by the generated text only (`previous_text_lens[i] += len(output.text)`, serving_completion.py), so chunks after the echo chunk do not count the prompt | counts the prompt, as the text the client holds | not fixed yet: the gateway needs the echoed prompt's length per choice |
| echo with logprobs | vLLM also fills `choices[].prompt_logprobs` | only when `prompt_logprobs` was asked | vLLM sets prompt logprobs internally for echo; a side effect, not a request |
| `stream_options: {}` without `stream` (trtllm) | trtllm 400 (`is not None` check) | accepted | vLLM's truthiness check (protocol.py validate_stream_options) is followed |
| completions `logprobs: 0` (trtllm) | the fake answers as vLLM (the sampled token) | asks trtllm-serve for 1, whose top list then has 2 | real trtllm-serve gives none for 0 (CompletionRequest.to_sampling_params); the fake is vLLM's here |
| `best_of` (kind `openai`) | the fake (vLLM) takes it | 400 `unsupported_parameter` | a plain OpenAI server has no `best_of` (SPEC: a clear 4xx) |
| per-chunk usage (kind `openai`) | the worker's counts | asks for final usage alone, so chunk counts start from 0 | OpenAI's StreamOptions has no `continuous_usage_stats` |
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import leaks
from tests.integration import openai_diff, procs

pytestmark = pytest.mark.integration

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {
    "name": "get", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
ALL, VLLM_TRT = ("m", "t", "o"), ("m", "t")


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Worker URLs by gateway model name, and the gateway's under "gateway"."""
    tmp: Path = tmp_path_factory.mktemp("differential")
    started: list[procs.Proc] = []
    try:
        sim, sim_url = procs.simulator(tmp)
        started.append(sim)
        port = procs.free_port()
        fake = procs.Proc([sys.executable, "-m", "tests.fakes.trtllm_fake", str(port)],
                          tmp / "trtllm.log")
        started.append(fake)
        fake_url = f"http://127.0.0.1:{port}"
        fake.wait_http(fake_url + "/health")
        models = [{"name": name, "backend": kind, "upstreams": [url], "upstream_model": "m"}
                  for name, kind, url in (("m", "vllm", sim_url), ("t", "trtllm", fake_url),
                                          ("o", "openai", fake_url))]
        gw, gw_url = procs.gateway(tmp, orjson.dumps({
            "server": {"timeouts": {"first_byte": 10, "idle": 5}, "failover_attempts": 0},
            "default_model": "m", "models": models}).decode())
        started.append(gw)
        yield {"m": sim_url, "t": fake_url, "o": fake_url, "gateway": gw_url}
    finally:
        for p in reversed(started):
            p.stop()


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    r = httpx.post(url, content=orjson.dumps(body), timeout=20,
                   headers={"content-type": "application/json"})
    return r.status_code, r.content


def check(urls: dict[str, str], path: str, body: dict[str, Any], kinds: tuple[str, ...]) -> None:
    """The worker's and the gateway's normalised answers are equal, for each worker kind."""
    norm = openai_diff.stream if body.get("stream") is True else openai_diff.whole
    for kind in kinds:
        with leaks.worker_side():  # trtllm-serve's validation text is its own to write
            worker = norm(*_post(urls[kind] + path, {**body, "model": "m"}))
        gateway = norm(*_post(urls["gateway"] + path, {**body, "model": kind}))
        assert openai_diff.as_worker_says(worker, gateway) == worker, (kind, body)


def _chat(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, "max_tokens": 3, **fields}


def _prompt(**fields: Any) -> dict[str, Any]:
    return {"prompt": "hi", "max_tokens": 3, **fields}


TOOL_MSGS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
              "tool_calls": [{"id": "c1", "type": "function",
                              "function": {"name": "get", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "42"}]
USAGE = {"include_usage": True}
CASES: list[tuple[str, str, dict[str, Any], tuple[str, ...]]] = [
    ("chat", CHAT, _chat(), ALL),
    ("chat_stream_usage", CHAT, _chat(stream=True, stream_options=USAGE), ALL),
    # vLLM and trtllm-serve StreamOptions: include_usage defaults to true
    ("stream_options_empty", CHAT, _chat(stream=True, stream_options={}), ALL),
    ("continuous_usage", CHAT, _chat(stream=True, stream_options={
        **USAGE, "continuous_usage_stats": True}), VLLM_TRT),
    ("continuous_alone", CHAT, _chat(stream=True,
                                     stream_options={"continuous_usage_stats": True}), VLLM_TRT),
    ("usage_off", CHAT, _chat(stream=True, stream_options={"include_usage": False}), ALL),
    ("n2", CHAT, _chat(n=2), ALL),
    ("n3_stream_logprobs", CHAT, _chat(n=3, stream=True, logprobs=True, top_logprobs=1,
                                       stream_options=USAGE), ALL),
    ("logprobs", CHAT, _chat(logprobs=True, top_logprobs=2), ALL),
    ("top_logprobs_alone", CHAT, _chat(top_logprobs=2), ALL),
    ("stop_hit", CHAT, _chat(max_tokens=8, stop=" let"), ALL),
    ("stop_hit_stream", CHAT, _chat(max_tokens=8, stop=[" let"], stream=True), ALL),
    ("stop_empty_string", CHAT, _chat(stop=""), ALL),
    ("stop_empty_list", CHAT, _chat(stop=[]), ALL),
    ("stop_many", CHAT, _chat(max_tokens=8, stop=list("abcdef")), ALL),
    ("max_completion_tokens", CHAT, {"messages": USER, "max_completion_tokens": 2}, ALL),
    ("both_limits", CHAT, _chat(max_completion_tokens=2, max_tokens=5), ALL),
    ("max_tokens_0", CHAT, _chat(max_tokens=0), ALL),
    ("temperature_negative", CHAT, _chat(temperature=-0.1), ALL),
    ("top_p_0", CHAT, _chat(top_p=0), ALL),
    ("top_p_past_1", CHAT, _chat(top_p=1.5), ALL),
    ("presence_past_2", CHAT, _chat(presence_penalty=3), ALL),
    ("frequency_past_-2", CHAT, _chat(frequency_penalty=-3), ALL),
    ("edges", CHAT, _chat(temperature=2, top_p=1, presence_penalty=-2, frequency_penalty=2), ALL),
    ("seed", CHAT, _chat(seed=42, temperature=1), ALL),
    ("unknown_field", CHAT, _chat(foo=1), VLLM_TRT),
    ("user", CHAT, _chat(user="u"), ALL),
    ("nulls", CHAT, _chat(max_tokens=None, n=None, temperature=None, stop=None, seed=None,
                          logprobs=None, model=None), ALL),
    ("n_0", CHAT, _chat(n=0), ALL),
    ("no_messages", CHAT, {"max_tokens": 2}, ALL),
    ("content_parts", CHAT, _chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}]), ALL),
    ("system", CHAT, _chat(messages=[{"role": "system", "content": "be nice"}, *USER]), ALL),
    ("prefill", CHAT, _chat(messages=[*USER, {"role": "assistant", "content": "Sure"}]), ALL),
    ("ipython_role", CHAT, _chat(messages=[*USER, {"role": "ipython", "content": "42"}]), ALL),
    ("tool_messages", CHAT, _chat(messages=TOOL_MSGS), ALL),
    ("tools_auto", CHAT, _chat(max_tokens=30, tools=TOOLS), ALL),
    ("tools_auto_stream", CHAT, _chat(max_tokens=30, tools=TOOLS, stream=True), ALL),
    ("tools_required_n2_stream", CHAT, _chat(max_tokens=30, n=2, stream=True, tools=TOOLS,
                                             tool_choice="required"), ALL),
    ("tools_named", CHAT, _chat(max_tokens=30, tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "get"}}), ALL),
    ("tools_named_unknown", CHAT, _chat(tools=TOOLS, tool_choice={
        "type": "function", "function": {"name": "zzz"}}), ALL),
    ("tools_none", CHAT, _chat(tools=TOOLS, tool_choice="none"), ALL),
    ("tool_choice_without_tools", CHAT, _chat(tool_choice="auto"), ALL),
    ("parallel_tool_calls", CHAT, _chat(parallel_tool_calls=False), ALL),
    ("response_format", CHAT, _chat(response_format={"type": "json_object"}), ALL),
    ("logit_bias", CHAT, _chat(logit_bias={"5": 1}), ALL),
    ("best_of", CHAT, _chat(best_of=2), VLLM_TRT),
    ("stream_options_without_stream", CHAT, _chat(stream_options=USAGE), ALL),
    ("reasoning", CHAT, _chat(max_tokens=8, chat_template_kwargs={"enable_thinking": True}),
     VLLM_TRT),
    ("reasoning_stream", CHAT, _chat(max_tokens=8, stream=True,
                                     chat_template_kwargs={"enable_thinking": True}), VLLM_TRT),
    ("completion", COMPLETIONS, _prompt(), ALL),
    ("prompt_list", COMPLETIONS, _prompt(prompt=["hi", "there"]), ALL),
    ("token_ids", COMPLETIONS, _prompt(prompt=[1, 2, 3]), ALL),
    ("token_id_lists", COMPLETIONS, _prompt(prompt=[[1, 2], [3, 4]]), ALL),
    ("prompt_list_n2_stream", COMPLETIONS, _prompt(prompt=["hi", "there"], n=2, stream=True,
                                                   stream_options=USAGE), ALL),
    ("completion_logprobs", COMPLETIONS, _prompt(logprobs=2), ALL),
    ("completion_logprobs_stream", COMPLETIONS, _prompt(logprobs=1, stream=True), ALL),
    ("echo", COMPLETIONS, _prompt(prompt="hi there", echo=True), ALL),
    ("echo_stream", COMPLETIONS, _prompt(prompt="hi there", echo=True, stream=True), ALL),
    ("suffix", COMPLETIONS, _prompt(suffix="end"), ALL),
    ("completion_best_of", COMPLETIONS, _prompt(best_of=2), VLLM_TRT),
    ("completion_stop_stream", COMPLETIONS, _prompt(max_tokens=8, stop=[" from"], stream=True),
     ALL),
    ("completion_default_limit", COMPLETIONS, {"prompt": "hi"}, ALL),
    ("empty_prompt_list", COMPLETIONS, _prompt(prompt=[]), ALL),
    ("completion_unknown_field", COMPLETIONS, _prompt(zzz=True), VLLM_TRT),
    ("completion_continuous_usage", COMPLETIONS, _prompt(stream=True, stream_options={
        **USAGE, "continuous_usage_stats": True}), VLLM_TRT),
    ("completion_stream_options_empty", COMPLETIONS, _prompt(stream=True, stream_options={}),
     ALL),
]


@pytest.mark.parametrize(("path", "body", "kinds"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_case(urls: dict[str, str], path: str, body: dict[str, Any],
              kinds: tuple[str, ...]) -> None:
    """Each hand-written case: see the module docstring for what is left out and why."""
    check(urls, path, body, kinds)


# ---- a bounded walk over the request space, where worker and gateway must agree ----

_WORDS = st.sampled_from(["hi", "there", "tell me", "6x7?", "é ü"])
_content = st.one_of(_WORDS, st.lists(_WORDS.map(lambda t: {"type": "text", "text": t}),
                                      min_size=1, max_size=2))
_stop = st.one_of(st.sampled_from(["", " let", "e"]),
                  st.lists(st.sampled_from([" made", " the", "a", ""]), max_size=5))
_stream_options = st.sampled_from([None, {}, USAGE, {"include_usage": False},
                                   {**USAGE, "continuous_usage_stats": True}])


@st.composite
def _messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(_WORDS)})
    msgs.append({"role": "user", "content": draw(_content)})
    shape = draw(st.sampled_from(["plain", "prefill", "tool"]))
    if shape == "prefill":
        msgs.append({"role": "assistant", "content": draw(_WORDS)})
    elif shape == "tool":
        msgs += TOOL_MSGS[1:]
    return msgs


def _common() -> dict[str, st.SearchStrategy[Any]]:
    """Fields both routes read, each drawn at, inside or past the edges both sides check."""
    return {
        "n": st.sampled_from([None, 0, 1, 2, 3]),
        "max_tokens": st.sampled_from([None, 1, 4, 8]),
        "temperature": st.sampled_from([None, -1, 0, 0.7, 2]),
        "top_p": st.sampled_from([None, 0, 0.5, 1, 1.01]),
        "presence_penalty": st.sampled_from([None, -2, 0.5, 2, 2.5]),
        "frequency_penalty": st.sampled_from([None, -2.5, -2, 1]),
        "seed": st.sampled_from([None, 0, 7]),
        "stop": _stop, "user": st.sampled_from([None, "u"]),
    }


def _drop_absent(body: dict[str, Any]) -> dict[str, Any]:
    """Unset fields left out (a drawn None stands for "not sent"), streams with their options."""
    out = {k: v for k, v in body.items() if v is not None}
    options = out.pop("stream_options", None)
    if out.get("stream") and options is not None:
        out["stream_options"] = options
    return out


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    logprobs = draw(st.sampled_from([None, False, True]))
    tools = draw(st.sampled_from([None, "auto", "required", "none"]))
    body = {"messages": draw(_messages()), "logprobs": logprobs,
            "top_logprobs": draw(st.sampled_from([None, 0, 2])) if logprobs else None,
            "max_completion_tokens": draw(st.sampled_from([None, 2, 5])),
            "response_format": draw(st.sampled_from([None, {"type": "json_object"}])),
            "tools": TOOLS if tools else None, "tool_choice": tools,
            "stream": draw(st.booleans()), "stream_options": draw(_stream_options),
            **{k: draw(v) for k, v in _common().items()}}
    return _drop_absent(body)


@st.composite
def completion_bodies(draw: st.DrawFn) -> dict[str, Any]:
    prompt = draw(st.one_of(_WORDS, st.lists(_WORDS, min_size=1, max_size=2),
                            st.lists(st.integers(1, 50), min_size=1, max_size=4),
                            st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=3),
                                     min_size=1, max_size=2)))
    body = {"prompt": prompt, "echo": draw(st.sampled_from([None, True])),
            # 0 is a known trtllm difference (module docstring)
            "logprobs": draw(st.sampled_from([None, 1, 2])),
            "stream": draw(st.booleans()), "stream_options": draw(_stream_options),
            **{k: draw(v) for k, v in _common().items()}}
    if body["stream"] and body["echo"]:  # streamed echo offsets: a known difference
        body["logprobs"] = None
    return _drop_absent(body)


WALK = settings(max_examples=25, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@WALK
@given(body=chat_bodies())
def test_chat_walk(urls: dict[str, str], body: dict[str, Any]) -> None:
    """Any drawn chat request: the simulator (vLLM 0.11 protocol.py validators,
    serving_chat.py) and the trtllm fake against the gateway before each."""
    check(urls, CHAT, body, VLLM_TRT)


@WALK
@given(body=completion_bodies())
def test_completion_walk(urls: dict[str, str], body: dict[str, Any]) -> None:
    """Any drawn completions request (list and token-id prompts, echo, logprobs): vLLM
    serving_completion.py as the simulator answers it, and the trtllm fake."""
    check(urls, COMPLETIONS, body, VLLM_TRT)
