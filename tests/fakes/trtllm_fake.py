"""A trtllm-serve fake: the simulator's model behind trtllm-serve's own request rules and bytes.

From NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py and openai_server.py
(wire-formats.md section 6.1): requests are `extra="forbid"` (an unknown field is a 400 with
the flat `{"object":"error",...}` body), `model` is required, `stream_options` needs `stream`;
stream chunks are `model_dump_json(exclude_none=True)`, the first written `data: {...} \\n\\n`
(a space before the blank line); there is no `return_token_ids`, so no token ids come back.

The model's chat template is `TEMPLATE` (TinyLlama-1.1B-Chat's Zephyr turns, `</s>` written
out, the BOS from `bos_token`). A completions prompt that is a chat rendered with it plus the
start of the assistant's answer is that chat continued (the way a gateway fails a chat stream
over through /v1/completions): answered as the simulator continues the assistant's turn, in
completions chunks, clean of the stream faults. Only with exactly one BOS, as the chat route
encodes the chat: CompletionRequest adds one unless `add_special_tokens` is false
(openai_protocol.py), and a prompt may write one out; a prompt with none or two is no
continuation, and gets a fresh answer.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from simulator import server, settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]

# openai_protocol.py: the fields both request classes declare, then each one's own (written out
# from the source, not from the gateway's tables, so that a field the gateway sends to the wrong
# route is refused here as trtllm-serve refuses it).
_BOTH = {"model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
         "presence_penalty", "response_format", "seed", "stop", "stream", "stream_options",
         "temperature", "top_p", "user", "echo", "best_of", "use_beam_search", "top_k",
         "top_p_min", "min_p", "repetition_penalty", "length_penalty", "early_stopping",
         "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
         "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
         "add_special_tokens", "disaggregated_params", "priority", "conversation_params",
         "lora_request", "prompt_ignore_length", "thinking_token_budget"}
ALLOWED_CHAT = _BOTH | {
    "messages", "prompt_token_ids", "top_logprobs", "max_completion_tokens", "tools",
    "tool_choice", "parallel_tool_calls", "reasoning_effort", "thinking",
    "add_generation_prompt", "documents", "chat_template", "chat_template_kwargs",
    "injected_chat_template_kwargs", "media_io_kwargs", "cache_salt", "agent_hierarchy",
    "mm_processor_kwargs"}
ALLOWED_COMPLETIONS = _BOTH | {"prompt", "suffix", "return_context_logits", "detokenize"}
# ChatCompletionRequest `reasoning_effort`: openai_harmony's ReasoningEffort or these.
REASONING_EFFORTS = {"low", "medium", "high", "max", "none"}

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}</s>\n"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
BOS = "<s>"
_TURN = re.compile(r"<\|(\w+)\|>\n(.*?)</s>\n", re.S)
_ANSWER = "<|assistant|>\n"


def continued_chat(body: dict[str, Any]) -> dict[str, Any] | None:
    """A completions body whose prompt is a chat rendered with TEMPLATE, one BOS, plus the
    start of the answer: the simulator's chat body that continues that answer (vLLM's
    `continue_final_message`); None for any other."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        return None
    bos = prompt.startswith(BOS) + (body.get("add_special_tokens", True) is True)
    rest = prompt.removeprefix(BOS)
    messages = []
    while m := _TURN.match(rest):
        messages.append({"role": m.group(1), "content": m.group(2)})
        rest = rest[m.end():]
    if bos != 1 or not messages or not rest.startswith(_ANSWER) or rest == _ANSWER:
        return None
    messages.append({"role": "assistant", "content": rest.removeprefix(_ANSWER)})
    chat = {k: v for k, v in body.items() if k not in ("prompt", "add_special_tokens")}
    return {**chat, "messages": messages, "continue_final_message": True,
            "add_generation_prompt": False}


def _drop_none(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _drop_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_none(x) for x in v]
    return v


def _invalid(data: dict[str, Any]) -> str:
    """The request classes' `mode="before"` validators (openai_protocol.py): stream options
    only with a stream, `top_logprobs` only with `logprobs`, no `suffix`, a `reasoning_effort`
    of its type; "" when none fails."""
    if data.get("stream_options") is not None and not data.get("stream"):
        return "stream_options can only be set if stream is true"
    if data.get("top_logprobs") is not None and not data.get("logprobs"):
        return "logprobs must be true when using top_logprobs"
    if data.get("suffix"):
        return "suffix is not supported"
    effort = data.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        return f"reasoning_effort: Input should be 'low', 'medium' or 'high' (given {effort!r})"
    return ""


def _guides(data: dict[str, Any]) -> dict[str, Any]:
    """trtllm-serve's own `response_format` kinds (openai_protocol.py
    _response_format_to_guided_decoding_params: `regex`, `json` with `schema`, `ebnf`) as the
    simulator's vLLM `structured_outputs`, which it reads (vLLM's response_format has none)."""
    fmt = data.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    key = {"regex": ("regex", "regex"), "json": ("json", "schema"), "ebnf": ("grammar", "ebnf")}
    if not isinstance(fmt, dict) or kind not in key:
        return data
    rest = {k: v for k, v in data.items() if k != "response_format"}
    return {**rest, "structured_outputs": {key[kind][0]: fmt.get(key[kind][1])}}


def _error(message: str) -> bytes:
    return orjson.dumps({"object": "error", "message": message, "type": "BadRequestError",
                         "param": None, "code": 400})


class TrtllmFake:
    """ASGI: check the request as trtllm-serve would, answer with its byte habits."""

    def __init__(self) -> None:
        self.sim = server.build_app(settings.SimulatorSettings())

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.sim(scope, receive, send)
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        data = orjson.loads(body)
        allowed = ALLOWED_CHAT if scope["path"] == "/v1/chat/completions" else ALLOWED_COMPLETIONS
        bad = sorted(set(data) - allowed)
        message = (f"1 validation error: {bad[0]}: Extra inputs are not permitted" if bad
                   else "model: Field required" if "model" not in data
                   else _invalid(data))
        if message:
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": _error(message)})
            return None
        if (guided := _guides(data)) is not data:
            data, body = guided, orjson.dumps(guided)
        chat = continued_chat(data) if scope["path"] == "/v1/completions" else None
        if chat is not None:
            body = orjson.dumps(chat)
            scope = {**scope, "path": "/v1/chat/completions",
                     "raw_path": b"/v1/chat/completions"}
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        first = [True]

        async def rewrite(m: Message) -> None:
            if m["type"] == "http.response.body" and m.get("body", b"").startswith(b"data: {"):
                m = dict(m)
                m["body"] = b"".join(self._event(e, first, chat is not None) for e in
                                     m["body"].split(b"\n\n") if e)
            await send(m)

        await self.sim(scope, replay, rewrite)
        return None

    @staticmethod
    def _event(event: bytes, first: list[bool], as_completion: bool = False) -> bytes:
        if not event.startswith(b"data: {"):
            return event + b"\n\n"
        obj = _drop_none(orjson.loads(event[6:]))
        if as_completion:  # CompletionStreamResponse: `text` where a chat chunk has `delta`
            obj["object"] = "text_completion"
            obj["id"] = "cmpl-" + obj["id"].removeprefix("chatcmpl-")
            for c in obj["choices"]:
                c["text"] = c.pop("delta", {}).get("content") or ""
        space = b" " if first[0] else b""
        first[0] = False
        return b"data: " + orjson.dumps(obj) + space + b"\n\n"


def app() -> TrtllmFake:
    return TrtllmFake()


if __name__ == "__main__":
    import sys

    import uvicorn

    uvicorn.run(app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
