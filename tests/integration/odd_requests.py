"""Requests whose fields hold odd values (wrong types, out-of-range and huge numbers, empty,
nested and long values, unknown roles), some with odd headers (media types, encodings,
request ids that are long, empty or not ASCII, credentials, origins) or query strings, drawn
from a seed, for every client protocol's routes: for comparing two gateways answer by
answer."""

from __future__ import annotations

import copy
import random
from typing import Any

ODD: list[Any] = [None, True, False, 0, -1, 1, 2, 1.5, -0.5, 0.0, 2**70, -(2**70), 1e308, "x",
                  "", "5", [], {}, [1], ["a"], {"a": 1}, [[1]], "\U0001f642" * 3, "a" * 5000,
                  [{"role": "user"}], {"type": "json_object"}]
MSG = [{"role": "user", "content": "hi"}]
TGI = ["max_new_tokens", "temperature", "top_k", "top_p", "stop", "seed", "details", "do_sample",
       "return_full_text", "decoder_input_details", "repetition_penalty", "top_n_tokens",
       "truncate", "typical_p", "best_of"]
# (path, a valid body, the fields to spoil; "a.b" is b inside a)
ROUTES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("/v1/chat/completions", {"model": "demo", "messages": MSG, "max_tokens": 4},
     ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
      "stop", "stream", "stream_options", "logprobs", "top_logprobs", "seed", "logit_bias",
      "presence_penalty", "response_format", "tools", "tool_choice", "ignore_eos", "min_tokens",
      "top_k", "echo", "add_generation_prompt"]),
    ("/v1/chat/completions", {"model": "demo", "messages": MSG, "max_tokens": 4, "stream": True},
     ["messages", "stream_options", "logprobs", "top_logprobs", "n", "stop", "tools"]),
    ("/v1/completions", {"model": "demo", "prompt": "hi", "max_tokens": 4},
     ["model", "prompt", "max_tokens", "temperature", "n", "stop", "stream", "logprobs", "echo",
      "best_of", "suffix", "seed", "logit_bias", "stream_options"]),
    ("/invocations", {"inputs": "hi", "parameters": {"max_new_tokens": 4}},
     ["inputs", "parameters", "stream", "tgi_compat", "parameters.n", "parameters.logprobs",
      *(f"parameters.{k}" for k in TGI)]),
    ("/invocations", {"messages": MSG, "max_tokens": 4},
     ["messages", "max_tokens", "temperature", "stream", "stop", "logprobs", "top_logprobs", "n",
      "tools", "tgi_compat"]),
    ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 4}},
     ["inputs", "parameters", "stream", "parameters.grammar", "parameters.adapter_id",
      *(f"parameters.{k}" for k in TGI)]),
    ("/generate_stream", {"inputs": "hi", "parameters": {"max_new_tokens": 4}},
     ["inputs", "parameters", *(f"parameters.{k}" for k in TGI)]),
    ("/_inference/chat_completion/demo/_stream", {"messages": MSG, "max_completion_tokens": 4},
     ["messages", "max_completion_tokens", "temperature", "stop", "tools", "tool_choice",
      "top_p", "model"]),
]


HEADERS: list[dict[str, str | bytes]] = [
    {"content-type": "text/plain"}, {"content-type": "application/json; charset=utf-8"},
    {"content-type": "application/x-www-form-urlencoded"}, {"content-type": ""},
    {"accept": "text/event-stream"}, {"accept": "application/jsonlines"},
    {"accept": "application/json"}, {"accept": "*/*;q=0"},
    {"x-request-id": "r" * 300}, {"x-request-id": ""}, {"x-request-id": b"\xc3\xa9\xff"},
    {"content-encoding": "gzip"}, {"content-encoding": "identity"},
    {"content-encoding": "br, gzip"}, {"content-encoding": "zstd"},
    {"authorization": "Bearer nope"}, {"authorization": "Basic Zm9vOmJhcg=="},
    {"authorization": ""}, {"x-opaque-id": "o" * 100}, {"origin": "http://example.test"},
    {"x-amzn-sagemaker-custom-attributes": "a=1"}, {"x-amzn-sagemaker-target-variant": "v"},
]
QUERIES = ["?stream=true", "?adapter=x", "?a=%ff%fe", "?" + "q" * 3000, "?&&==",
           "?filter_path=x&pretty", "?timeout=1s&error_trace=true"]


def odd_requests(seed: int, count: int) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(path with any query, JSON body, headers) for each of `count` requests."""
    rng = random.Random(seed)
    drawn = []
    for _ in range(count):
        path, valid, fields = rng.choice(ROUTES)
        body = copy.deepcopy(valid)
        for _ in range(rng.choice((1, 1, 2, 3))):
            spoil(body, rng.choice(fields), rng)
        headers: dict[str, Any] = {}
        if rng.random() < 0.3:
            for _ in range(rng.choice((1, 1, 2))):
                headers.update(rng.choice(HEADERS))
        if rng.random() < 0.1:
            path += rng.choice(QUERIES)
        drawn.append((path, body, headers))
    return drawn


def spoil(body: dict[str, Any], field: str, rng: random.Random) -> None:
    value = rng.choice(ODD) if rng.random() >= 0.15 else [rng.choice(ODD), rng.choice(ODD)]
    if field == "messages" and rng.random() < 0.5:
        value = [{"role": rng.choice(["user", "system", "assistant", "tool", "x", 5, None]),
                  "content": rng.choice([*ODD, "hi", [{"type": "text", "text": "hi"}],
                                         [{"type": "image_url"}]])}]
    outer, _, inner = field.partition(".")
    if inner:
        if not isinstance(body.get(outer), dict):
            body[outer] = {}
        body[outer][inner] = value
    elif rng.random() < 0.1:
        body.pop(outer, None)
    else:
        body[outer] = value
