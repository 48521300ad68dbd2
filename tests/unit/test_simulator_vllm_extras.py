"""vLLM's extra request fields on the simulator: include_stop_str_in_output, prompt_logprobs,
echo with logprobs, structured output on completions, truncate_prompt_tokens, response_format
validation and continuous usage stats.

Sources (vLLM 0.11): `entrypoints/openai/protocol.py` (to_sampling_params, check_logprobs,
AnyResponseFormat), `serving_completion.py`, `serving_chat.py`, `entrypoints/renderer.py`,
`v1/engine/detokenizer.py`, `v1/engine/logprobs.py`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from simulator import SimulatorSettings, build_app, tokens
from tests.unit.test_simulator_app import call, chat, events

CHAT, CMPL = "/v1/chat/completions", "/v1/completions"


@pytest.fixture
def app() -> Any:
    return build_app(SimulatorSettings(tokens=6))


def _text(evs: list[Any]) -> list[str]:
    return [e["choices"][0]["delta"].get("content") for e in evs[1:-1] if e["choices"]]


def test_include_stop_str_in_output_streams_token_texts_and_keeps_the_match(app: Any) -> None:
    """detokenizer.py: stop_buffer_length is 0 with include_stop_str_in_output, so deltas keep
    the token boundaries, and check_stop_strings truncates after the matched stop string."""
    whole = call(app, "POST", CHAT, chat()).json()["choices"][0]["message"]["content"]
    words = [" " + w for w in whole.split()]
    stop = words[3][1:]  # a whole word: the answer stops right after it
    req = chat(stream=True, stop=[stop], include_stop_str_in_output=True)
    texts = _text(events(call(app, "POST", CHAT, req)))
    assert [t for t in texts if t] == words[:4]
    body = call(app, "POST", CHAT, chat(stop=[stop], include_stop_str_in_output=True)).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == "".join(words[:4]) and choice["stop_reason"] == stop
    plain = _text(events(call(app, "POST", CHAT, chat(stream=True, stop=[stop]))))
    assert "".join(t or "" for t in plain) == "".join(words[:3]) + " "  # without it: cut


def _check_prompt_logprobs(plp: Any, ids: list[int], k: int) -> None:
    assert plp[0] is None and len(plp) == len(ids)
    for cur, step in zip(ids[1:], plp[1:], strict=True):
        first = next(iter(step))
        assert first == str(cur) and len(step) in (k, k + 1)
        assert all(list(e) == ["logprob", "rank", "decoded_token"] for e in step.values())
        assert step[first]["decoded_token"] == tokens.token_text(cur)


def test_prompt_logprobs_on_both_endpoints(app: Any) -> None:
    """serving_completion.py puts each prompt's `prompt_logprobs` on its choices and
    serving_chat.py on the response, as list[dict[int, Logprob] | None] (first token None);
    `prompt_token_ids` still only come with return_token_ids."""
    body = call(app, "POST", CMPL, {"prompt": "tell me a story", "prompt_logprobs": 2}).json()
    choice = body["choices"][0]
    ids = [tokens.BOS_ID, *tokens.encode("tell me a story")]
    _check_prompt_logprobs(choice["prompt_logprobs"], ids, 2)
    assert choice["prompt_token_ids"] is None and choice["logprobs"] is None
    resp = call(app, "POST", CHAT, chat(prompt_logprobs=0, return_token_ids=True)).json()
    _check_prompt_logprobs(resp["prompt_logprobs"], resp["prompt_token_ids"], 0)
    assert call(app, "POST", CHAT, chat()).json()["prompt_logprobs"] is None


@pytest.mark.parametrize(
    "body, message",
    [
        ({"prompt_logprobs": 1, "stream": True}, "`prompt_logprobs` are not available when"),
        ({"prompt_logprobs": -1, "stream": True}, "`prompt_logprobs` are not available when"),
        ({"prompt_logprobs": -2}, "`prompt_logprobs` must be a positive value or -1."),
        ({"prompt_logprobs": 21}, "Requested prompt logprobs of 21, which is greater than"),
        ({"response_format": {"type": "bogus"}}, "`response_format.type` must be one of"),
        ({"response_format": "json"}, "`response_format` must be an object"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "`response_format"),
        ({"response_format": {"type": "structural_tag"}}, "`response_format` of type"),
        ({"truncate_prompt_tokens": -2}, "`truncate_prompt_tokens` must be greater than"),
    ],
)
@pytest.mark.parametrize("path", [CHAT, CMPL])
def test_vllm_refuses_bad_extras_with_400(
    app: Any, path: str, body: dict[str, Any], message: str
) -> None:
    """protocol.py check_logprobs, AnyResponseFormat (Literal type; StructuralTagResponseFormat
    needs structures and triggers; JsonSchemaResponseFormat needs a name) and
    truncate_prompt_tokens ge=-1: pydantic errors are 400 BadRequestError in vLLM's body."""
    req = chat(**body) if path == CHAT else {"prompt": "hi", **body}
    resp = call(app, "POST", path, req)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["message"].startswith(message) and err["type"] == "BadRequestError"


def test_echo_with_logprobs_covers_the_prompt(app: Any) -> None:
    """to_sampling_params: echo sets prompt_logprobs = logprobs; request_output_to_completion_
    response joins prompt and output logprobs, the first prompt token with none, and
    _create_completion_logprobs counts text_offset from 0 by token-string lengths."""
    req = {"prompt": "tell me", "echo": True, "logprobs": 1, "max_tokens": 3}
    choice = call(app, "POST", CMPL, req).json()["choices"][0]
    plain = call(app, "POST", CMPL, {**req, "echo": False}).json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == "tell me" + plain["text"]
    assert lp["tokens"] == ["<s>", " tell", " me", *plain["logprobs"]["tokens"]]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][3:] == plain["logprobs"]["token_logprobs"]
    assert all(len(t) in (1, 2) for t in lp["top_logprobs"][1:3])
    assert lp["text_offset"][:4] == [0, 3, 8, 11]
    assert choice["prompt_logprobs"][1][str(lp_id(" tell"))]["logprob"] == lp["token_logprobs"][1]
    evs = events(call(app, "POST", CMPL, {**req, "stream": True}))
    first, second = evs[0]["choices"][0], evs[1]["choices"][0]
    assert first["text"] == "tell me" + plain["logprobs"]["tokens"][0]
    assert first["logprobs"]["tokens"] == lp["tokens"][:4] and first["prompt_token_ids"]
    # completion_stream_generator: previous_text_lens grows by the output's text only
    assert second["logprobs"]["text_offset"] == [len(plain["logprobs"]["tokens"][0])]


def lp_id(text: str) -> int:
    return tokens.encode(text)[0]


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_returns_just_the_prompt(app: Any, stream: bool) -> None:
    """echo_without_generation: vLLM samples one token (max_tokens=1), shows only the prompt
    with its logprobs, and still counts that token in usage and finish_reason."""
    req = {"prompt": "tell me", "echo": True, "max_tokens": 0, "logprobs": 0, "stream": stream,
           **({"stream_options": {"include_usage": True}} if stream else {})}
    resp = call(app, "POST", CMPL, req)
    if stream:
        evs = events(resp)
        choice, usage = evs[0]["choices"][0], evs[1]["usage"]
        assert len(evs) == 3 and choice["finish_reason"] == "length"
    else:
        choice, usage = resp.json()["choices"][0], resp.json()["usage"]
    assert choice["text"] == "tell me"
    assert choice["logprobs"]["tokens"] == ["<s>", " tell", " me"]
    assert usage["completion_tokens"] == 1 and usage["prompt_tokens"] == 3


@pytest.mark.parametrize(
    "extra",
    [
        {"response_format": {"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"properties": {
                                 "city": {"type": "string"}, "n": {"type": "integer"}}}}}},
        {"guided_json": {"properties": {"city": {"type": "string"}, "n": {"type": "integer"}}}},
        {"structured_outputs": {"json": json.dumps(
            {"properties": {"city": {"type": "string"}, "n": {"type": "integer"}}})}},
    ],
)
def test_completions_honour_structured_output(app: Any, extra: dict[str, Any]) -> None:
    """CompletionRequest.to_sampling_params turns response_format (and guided_json /
    structured_outputs.json) into structured-output params, as chat does."""
    body = call(app, "POST", CMPL, {"prompt": "hi", "max_tokens": 100, **extra}).json()
    assert list(json.loads(body["choices"][0]["text"])) == ["city", "n"]
    obj = call(app, "POST", CMPL, {"prompt": "hi", "max_tokens": 100,
                                   "response_format": {"type": "json_object"}}).json()
    assert isinstance(json.loads(obj["choices"][0]["text"]), dict)
    chat_body = call(app, "POST", CHAT, chat(**extra)).json()
    assert list(json.loads(chat_body["choices"][0]["message"]["content"])) == ["city", "n"]


def test_truncate_prompt_tokens_keeps_the_last_tokens(app: Any) -> None:
    """renderer.py: token prompts keep ids[-N:]; text prompts are tokenized with
    truncation_side left (BOS stays); N over max_model_len - max_tokens is refused."""
    text = "one two three four five six"
    body = call(app, "POST", CMPL, {"prompt": text, "truncate_prompt_tokens": 3,
                                    "return_token_ids": True}).json()
    ids = [tokens.BOS_ID, *tokens.encode(text)]
    assert body["usage"]["prompt_tokens"] == 3
    assert body["choices"][0]["prompt_token_ids"] == [ids[0], *ids[-2:]]
    body = call(app, "POST", CMPL, {"prompt": ids, "truncate_prompt_tokens": 4,
                                    "echo": True, "max_tokens": 1}).json()
    assert body["usage"]["prompt_tokens"] == 4
    assert body["choices"][0]["text"].startswith(tokens.decode(ids[-4:]))
    resp = call(app, "POST", CHAT, chat("one two three four", truncate_prompt_tokens=2))
    assert resp.json()["usage"]["prompt_tokens"] == 2
    too_many = call(app, "POST", CMPL, {"prompt": "x", "truncate_prompt_tokens": 8190})
    assert too_many.status_code == 400
    assert too_many.json()["error"]["message"].startswith(
        "truncate_prompt_tokens (8190) cannot be greater than max_length (8176)")


def test_continuous_usage_stats_on_every_chunk(app: Any) -> None:
    """serving_chat.py / serving_completion.py with continuous_usage_stats: each chunk carries
    UsageInfo (prompt_tokens, total_tokens, completion_tokens); chat's role chunk counts 0,
    chat dumps exclude_unset (3 keys), completions exclude nothing (prompt_tokens_details)."""
    opts = {"include_usage": True, "continuous_usage_stats": True}
    evs = events(call(app, "POST", CHAT, chat(stream=True, stream_options=opts)))[:-1]
    assert [list(e["usage"]) for e in evs] == [
        ["prompt_tokens", "total_tokens", "completion_tokens"]] * len(evs)
    assert [e["usage"]["completion_tokens"] for e in evs] == [*range(len(evs) - 1), len(evs) - 2]
    evs = events(call(app, "POST", CMPL, {"prompt": "hi", "stream": True,
                                          "stream_options": opts}))[:-1]
    assert [e["usage"] for e in evs[:-1]] == [
        {"prompt_tokens": 2, "total_tokens": 2 + k, "completion_tokens": k,
         "prompt_tokens_details": None} for k in range(1, len(evs))]
    assert evs[-1]["usage"] == {"prompt_tokens": 2, "total_tokens": 1 + len(evs),
                                "completion_tokens": len(evs) - 1}
