"""A trtllm-serve fake: the simulator's model behind trtllm-serve's own request rules and bytes.

From NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_protocol.py and openai_server.py
(wire-formats.md section 6.1): requests are `extra="forbid"` (an unknown field is FastAPI's
RequestValidationError, which openai_server.py answers 400 `{"error": "<its text>"}`), `model`
is required, `stream_options` needs `stream`. The answers are the simulator's, rewritten into
trtllm-serve's bytes by tests/fakes/trtllm_shapes.py (its chunk and body shapes, a cut
connection for a failed stream, the flat error body); there is no `return_token_ids`, so no
token ids come back.

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
from tests.fakes import trtllm_shapes as shapes

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


def _invalid(data: dict[str, Any]) -> str:
    """The request classes' `mode="before"` validators (openai_protocol.py): stream options
    only with a stream, `top_logprobs` only with `logprobs`, no `suffix`, a `reasoning_effort`
    of its type; "" when none fails."""
    if data.get("stream_options") is not None and not data.get("stream"):
        return "Stream options can only be defined when stream is true."
    if data.get("top_logprobs") is not None and not data.get("logprobs"):
        return "logprobs must be true when using top_logprobs"
    if data.get("suffix"):
        return "suffix is not supported"
    effort = data.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        return f"reasoning_effort: Input should be 'low', 'medium' or 'high' (given {effort!r})"
    return ""


def _errors(data: dict[str, Any], allowed: set[str]) -> list[dict[str, Any]]:
    """pydantic's error dicts for the body, as FastAPI collects them (no `url`)."""
    out: list[dict[str, Any]] = [
        {"type": "extra_forbidden", "loc": ("body", name), "msg": "Extra inputs are not permitted",
         "input": data[name]} for name in sorted(set(data) - allowed)]
    if "model" not in data:
        out.append({"type": "missing", "loc": ("body", "model"), "msg": "Field required",
                    "input": data})
    if not out and (message := _invalid(data)):
        out.append({"type": "value_error", "loc": ("body",), "msg": f"Value error, {message}",
                    "input": data, "ctx": {"error": ValueError(message)}})
    return out


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


class TrtllmFake:
    """ASGI: check the request as trtllm-serve would, answer with its byte habits
    (tests/fakes/trtllm_shapes.py)."""

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
        path = scope["path"]
        allowed = ALLOWED_CHAT if path == "/v1/chat/completions" else ALLOWED_COMPLETIONS
        if errors := _errors(data, allowed):
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body",
                        "body": shapes.validation_error(errors, path)})
            return None
        if (guided := _guides(data)) is not data:
            data, body = guided, orjson.dumps(guided)
        chat = continued_chat(data) if path == "/v1/completions" else None
        if chat is not None:
            body = orjson.dumps(chat)
            scope = {**scope, "path": "/v1/chat/completions",
                     "raw_path": b"/v1/chat/completions"}
        await self.sim(scope, self._replay(body, receive),
                       self._rewrite(send, path, data, chat is not None))
        return None

    @staticmethod
    def _replay(body: bytes, receive: Callable[[], Awaitable[Message]]
                ) -> Callable[[], Awaitable[Message]]:
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return replay

    @staticmethod
    def _rewrite(send: Callable[[Message], Awaitable[None]], path: str, data: dict[str, Any],
                 from_chat: bool) -> Callable[[Message], Awaitable[None]]:
        """The simulator's answer as trtllm-serve writes it; its in-band error cuts the
        connection instead, as trtllm-serve's re-raising stream generator does."""
        chat = path == "/v1/chat/completions"
        choice = data.get("tool_choice")
        named = choice["function"]["name"] if isinstance(choice, dict) else None
        held: list[Message] = []  # a JSON answer's start, sent with its new length

        async def rewrite(m: Message) -> None:
            if m["type"] == "http.response.start" and not _is_sse(m):
                held.append(m)
                return
            body = m.get("body", b"")
            if m["type"] != "http.response.body" or not body:
                return await send(m)
            if held:
                start = held.pop()
                if start["status"] != 200:
                    body = shapes.flat_error(body)
                else:
                    obj = orjson.loads(body)
                    body = orjson.dumps(shapes.chat_body(obj, named) if chat
                                        else shapes.completion_body(obj, from_chat))
                headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
                await send({**start, "headers": [*headers, (b"content-length",
                                                             str(len(body)).encode())]})
                return await send({**m, "body": body})
            try:
                body = shapes.stream(body, chat, named, from_chat)
            except shapes.StreamCut as cut:
                await send({"type": "http.response.body", "body": cut.args[0],
                            "more_body": True})
                raise
            await send({**m, "body": body})
        return rewrite


def _is_sse(start: Message) -> bool:
    return any(k == b"content-type" and v.startswith(b"text/event-stream")
               for k, v in start["headers"])


def app() -> TrtllmFake:
    return TrtllmFake()


if __name__ == "__main__":
    import sys

    import uvicorn

    uvicorn.run(app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
