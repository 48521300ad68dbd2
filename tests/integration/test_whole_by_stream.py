"""A whole answer folded from the worker's stream is the same answer, byte for byte, as the one
made from its non-streaming body (gateway.whole).

Two gateways in front of one simulator (deterministic): `body` (first_byte 60: every request
here, bounded at 12 or 30 tokens, goes to the worker as one JSON body) and `folded` (first_byte
2: a whole answer longer than 4 tokens is asked as a stream and folded). Every client protocol
that can ask a whole answer sends the same requests to both; what the worker was sent is read
from the simulator's /_sim/last_request, and the client's bytes are compared with only the
response ids and `created` blanked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.integration import procs

pytestmark = pytest.mark.integration

MODELS = (("demo", "vllm", "{}"), ("compat", "vllm", "{tgi_compat: true}"),
          ("plain", "openai", "{}"), ("trt", "trtllm", "{}"))


def config(sim_url: str, first_byte: float) -> str:
    models = "".join(f"""
  - name: {name}
    backend: {backend}
    upstreams: [{sim_url}]
    upstream_model: org/demo-model
    lmi: {lmi}""" for name, backend, lmi in MODELS)
    return f"""
server: {{timeouts: {{first_byte: {first_byte}, idle: 5}}}}
default_model: demo
models:{models}
"""


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("whole")
    sim, sim_url = procs.simulator(tmp)
    body, body_url = procs.gateway(tmp, config(sim_url, 60))
    folded, folded_url = procs.gateway(tmp, config(sim_url, 2))
    try:
        yield {"sim": sim_url, "body": body_url, "folded": folded_url}
    finally:
        folded.stop()
        body.stop()
        sim.stop()


MSGS = [{"role": "user", "content": "What is deep learning?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (CHAT, {"model": "demo", "messages": MSGS, "max_tokens": 12}),
    "chat_n2": (CHAT, {"model": "demo", "messages": MSGS, "max_tokens": 12, "n": 2,
                       "temperature": 0.8, "seed": 7}),
    "chat_logprobs": (CHAT, {"model": "demo", "messages": MSGS, "max_tokens": 12,
                             "logprobs": True, "top_logprobs": 2}),
    "chat_stop": (CHAT, {"model": "demo", "messages": MSGS, "max_tokens": 12, "stop": ["e"]}),
    "chat_tools": (CHAT, {"model": "demo", "messages": MSGS, "max_tokens": 30, "tools": TOOLS}),
    "chat_tool_named": (CHAT, {"model": "demo", "messages": MSGS, "max_completion_tokens": 30,
                               "tools": TOOLS, "tool_choice": {
                                   "type": "function", "function": {"name": "get_weather"}}}),
    "chat_reasoning": (CHAT, {"model": "demo", "max_tokens": 12, "messages": [
        {"role": "user", "content": "Think first. [[sim reasoning=3]]"}]}),
    "chat_response_format": (CHAT, {"model": "demo", "messages": MSGS, "max_tokens": 30,
                                    "response_format": SCHEMA}),
    "chat_tgi_placeholder": (CHAT, {"model": "tgi", "messages": MSGS, "max_tokens": 12}),
    "chat_openai_worker": (CHAT, {"model": "plain", "messages": MSGS, "max_tokens": 12,
                                  "logprobs": True, "top_logprobs": 1}),
    "chat_trtllm_worker": (CHAT, {"model": "trt", "messages": MSGS, "max_tokens": 12, "n": 2}),
    "text": (TEXT, {"model": "demo", "prompt": "Once upon a time", "max_tokens": 12}),
    "text_n2_logprobs": (TEXT, {"model": "demo", "prompt": "Once upon a time", "max_tokens": 12,
                                "n": 2, "logprobs": 2, "temperature": 0.8, "seed": 3}),
    "text_list": (TEXT, {"model": "demo", "prompt": ["One", "Two"], "max_tokens": 12}),
    "text_stop": (TEXT, {"model": "demo", "prompt": "Once", "max_tokens": 12, "stop": ["o"]}),
    "text_echo": (TEXT, {"model": "demo", "prompt": "Once", "max_tokens": 12, "echo": True}),
    "text_trtllm_worker": (TEXT, {"model": "trt", "prompt": "Once", "max_tokens": 12,
                                  "logprobs": 1}),
    "lmi_inputs": ("/invocations", {"inputs": "What is AI?"}),  # LMI's default: 30 tokens
    "lmi_inputs_details": ("/invocations", {"inputs": "What is AI?", "parameters": {
        "max_new_tokens": 12, "details": True, "top_n_tokens": 2, "stop_sequences": ["e"]}}),
    "lmi_inputs_list": ("/invocations", {"inputs": ["One", "Two"],
                                         "parameters": {"max_new_tokens": 12}}),
    "lmi_tgi_compat": ("/predictions/compat", {"inputs": "What is AI?",
                                               "parameters": {"max_new_tokens": 12}}),
    "lmi_messages": ("/invocations", {"messages": MSGS, "max_tokens": 12, "logprobs": True,
                                      "top_logprobs": 1}),
    "lmi_prompt": ("/invocations", {"prompt": "Once upon a time", "max_tokens": 12}),
    "tgi_generate": ("/generate", {"inputs": "What is AI?", "parameters": {
        "max_new_tokens": 12, "details": True, "top_n_tokens": 2}}),
    "tgi_generate_stop": ("/generate", {"inputs": "What is AI?", "parameters": {
        "max_new_tokens": 12, "stop": ["e"]}}),
    "tgi_root": ("/", {"inputs": "What is AI?", "stream": False,
                       "parameters": {"max_new_tokens": 12, "details": True}}),
    "elastic_completion": ("/_inference/completion/demo", {
        "input": "What is Elastic?", "task_settings": {"max_tokens": 12}}),
    "elastic_chat": ("/_inference/chat_completion/demo", {
        "messages": MSGS, "max_completion_tokens": 12}),
    "elastic_chat_tools": ("/_inference/chat_completion/demo", {
        "messages": MSGS, "max_completion_tokens": 30, "tools": TOOLS}),
}

_IDS = re.compile(rb'"(id|created)": ?("[^"]*"|\d+)')


def blank_ids(body: bytes) -> bytes:
    return _IDS.sub(rb'"\1":""', body)


def ask(urls: dict[str, str], which: str, path: str, body: dict[str, Any]
        ) -> tuple[httpx.Response, dict[str, Any]]:
    r = httpx.post(urls[which] + path, json=body, timeout=30)
    sent = httpx.get(urls["sim"] + "/_sim/last_request", timeout=5).json()["body"]
    return r, sent


@pytest.mark.parametrize("case", list(CASES))
def test_a_folded_stream_gives_the_bytes_of_the_whole_body(urls: dict[str, str],
                                                           case: str) -> None:
    path, body = CASES[case]
    one, sent_one = ask(urls, "body", path, body)
    folded, sent_folded = ask(urls, "folded", path, body)
    assert sent_one["stream"] is False and "stream_options" not in sent_one
    assert sent_folded["stream"] is True
    assert sent_folded["stream_options"] == {"include_usage": True}
    assert {k: v for k, v in sent_folded.items() if k not in ("stream", "stream_options")} \
        == {k: v for k, v in sent_one.items() if k != "stream"}
    assert one.status_code == 200, one.text
    assert folded.headers["content-type"] == one.headers["content-type"]
    assert (folded.status_code, blank_ids(folded.content)) == (200, blank_ids(one.content))
    assert orjson.loads(one.content)  # an answer, not an empty body
