"""The bytes trtllm-serve writes, made from the simulator's vLLM-shaped answers.

Source: NVIDIA/TensorRT-LLM tensorrt_llm/serve/postprocess_handlers.py (chat_stream_post_processor,
chat_response_post_processor, completion_stream_post_processor,
completion_response_post_processor), openai_protocol.py (field order of each class) and
openai_server.py (JSONResponse of `model_dump()`; the stream generator re-raises a failure, so
the connection is cut: no error event, no `[DONE]`):

- chat chunks: `model_dump_json(exclude_none=True)`; the role chunk is `{"role": ...}` alone,
  written `data: {...} \\n\\n`; every later delta is `DeltaMessage(content=<text>,
  reasoning_content=<reasoning text>, ...)`, both "" when there is none (no reasoning parser);
  a tool call fragment always has `"type":"function"`, its id only with its name. A named
  `tool_choice` puts its name on every fragment, with no id, and ends the choice with "stop".
- completions chunks: `model_dump_json(exclude_unset=False)`: every field, nulls included,
  `"usage":null` on each; no space before the blank line.
- the usage chunk: plain `model_dump_json()`; UsageInfo is `prompt_tokens, total_tokens,
  completion_tokens, prompt_tokens_details{cached_tokens}`.
"""

from __future__ import annotations

from typing import Any

import orjson

Obj = dict[str, Any]


class StreamCut(ConnectionAbortedError):
    """trtllm-serve's stream generator re-raised: the server cuts the connection."""


def usage(u: Obj | None) -> Obj | None:
    if u is None:
        return None
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"prompt_tokens": u["prompt_tokens"], "total_tokens": u["total_tokens"],
            "completion_tokens": u["completion_tokens"],
            "prompt_tokens_details": {"cached_tokens": cached}}


def _head(obj: Obj, kind: str, prefix: str) -> Obj:
    return {"id": prefix + obj["id"].split("-", 1)[-1], "object": kind,
            "created": obj["created"], "model": obj["model"]}


def _call(t: Obj, named: str | None, choice: int) -> Obj:
    fn = t.get("function") or {}
    if named is not None:  # DeltaToolCall(function=DeltaFunctionCall(name, arguments), index=i)
        return {"type": "function", "index": choice,
                "function": {"name": named, "arguments": fn.get("arguments") or ""}}
    out: Obj = {"id": t["id"]} if t.get("id") else {}
    out.update({"type": "function", "index": t.get("index", 0)})
    out["function"] = {k: fn[k] for k in ("name", "arguments") if fn.get(k) is not None}
    return out


def chat_chunk(obj: Obj, named: str | None) -> tuple[bytes, bool]:
    """One simulator chat chunk as trtllm-serve writes it, and whether it is a role chunk
    (written with a space before its blank line)."""
    head = _head(obj, "chat.completion.chunk", "chatcmpl-")
    if not obj["choices"]:  # the usage chunk: model_dump_json(), every field
        return orjson.dumps({**head, "choices": [], "usage": usage(obj.get("usage"))}), False
    choices, role = [], False
    for c in obj["choices"]:
        d, i = c.get("delta") or {}, c.get("index", 0)
        if d.get("role"):
            role = True
            delta: Obj = {"role": d["role"]}
        elif named is not None:
            calls = d.get("tool_calls") or [{}]
            delta = {"tool_calls": [_call(t, named, i) for t in calls]}
        else:
            delta = {"content": d.get("content") or "",
                     "reasoning_content": d.get("reasoning_content") or d.get("reasoning") or ""}
            if d.get("tool_calls"):
                delta["tool_calls"] = [_call(t, None, i) for t in d["tool_calls"]]
        choice: Obj = {"index": i, "delta": delta}
        if c.get("logprobs") is not None:
            choice["logprobs"] = c["logprobs"]
        if c.get("finish_reason") is not None:
            reason = c["finish_reason"]
            choice["finish_reason"] = "stop" if named is not None and reason == "tool_calls" \
                else reason
        if c.get("stop_reason") is not None:
            choice["stop_reason"] = c["stop_reason"]
        choices.append(choice)
    out = {**head, "choices": choices}
    if obj.get("usage") is not None:  # continuous_usage_stats
        out["usage"] = usage(obj["usage"])
    return orjson.dumps(out), role


def completion_chunk(obj: Obj, from_chat: bool) -> bytes | None:
    """One completions chunk (or a chat chunk of a continued chat, as its completions chunk);
    None for a chat role chunk, which a completions stream has no equal of."""
    head = _head(obj, "text_completion", "cmpl-")
    choices = []
    for c in obj["choices"]:
        if from_chat and (c.get("delta") or {}).get("role"):
            return None
        text = (c.get("delta") or {}).get("content") or "" if from_chat else c.get("text", "")
        choices.append({"index": c.get("index", 0), "text": text, "token_ids": None,
                        "logprobs": None if from_chat else c.get("logprobs"),
                        "finish_reason": c.get("finish_reason"),
                        "stop_reason": c.get("stop_reason"),
                        "avg_decoded_tokens_per_iter": None})
    return orjson.dumps({**head, "choices": choices, "usage": usage(obj.get("usage"))})


def stream(body: bytes, chat: bool, named: str | None, from_chat: bool) -> bytes:
    """A piece of the simulator's SSE body, rewritten. Its error event cuts the stream:
    StreamCut, holding what came before it in the piece."""
    out = []
    for event in body.split(b"\n\n"):
        if not event:
            continue
        if not event.startswith(b"data: {"):
            out.append(event + b"\n\n")
            continue
        obj = orjson.loads(event[6:])
        if "error" in obj:
            raise StreamCut(b"".join(out))
        if chat and not from_chat:
            data, role = chat_chunk(obj, named)
            out.append(b"data: " + data + (b" \n\n" if role else b"\n\n"))
        elif (data_ := completion_chunk(obj, from_chat)) is not None:
            out.append(b"data: " + data_ + b"\n\n")
    return b"".join(out)


def chat_body(obj: Obj, named: str | None) -> Obj:
    """ChatCompletionResponse as `model_dump()`: every field, nulls included."""
    choices = []
    for c in obj["choices"]:
        m = c["message"]
        reason = c.get("finish_reason")
        calls = [{"id": t["id"], "type": "function",
                  "function": {"name": t["function"]["name"],
                               "arguments": t["function"]["arguments"]}}
                 for t in m.get("tool_calls") or ()]
        choices.append({
            "index": c["index"],
            "message": {"role": m["role"], "content": m.get("content") or "",
                        "reasoning_content": m.get("reasoning_content") or m.get("reasoning")
                        or "", "reasoning": None, "tool_calls": calls},
            "logprobs": c.get("logprobs"),
            "finish_reason": "stop" if named is not None and reason == "tool_calls" else reason,
            "stop_reason": c.get("stop_reason"), "mm_embedding_handle": None,
            "disaggregated_params": None, "avg_decoded_tokens_per_iter": None})
    return {**_head(obj, "chat.completion", "chatcmpl-"), "choices": choices,
            "usage": usage(obj["usage"]), "prompt_token_ids": None,
            "prompt_token_ids_b64": None}


def completion_body(obj: Obj, from_chat: bool) -> Obj:
    """CompletionResponse as `model_dump()` (a continued chat's answer as its completion)."""
    choices = [{"index": c["index"],
                "text": (c["message"].get("content") or "") if from_chat else c["text"],
                "token_ids": None, "logprobs": None if from_chat else c.get("logprobs"),
                "context_logits": None, "finish_reason": c.get("finish_reason"),
                "stop_reason": c.get("stop_reason"), "disaggregated_params": None,
                "avg_decoded_tokens_per_iter": None} for c in obj["choices"]]
    return {**_head(obj, "text_completion", "cmpl-"), "choices": choices,
            "usage": usage(obj["usage"]), "prompt_token_ids": None}


def validation_error(errors: list[Obj], path: str) -> bytes:
    """openai_server.py validation_exception_handler: 400 `{"error": str(exc)}`, FastAPI's
    RequestValidationError text (fastapi/exceptions.py ValidationException.__str__: a count,
    each pydantic error dict's repr, then where the endpoint is)."""
    n = len(errors)
    lines = [f"{n} validation error{'s' if n != 1 else ''}:"]
    lines += [f"  {e}" for e in errors]
    endpoint = "openai_chat" if path.endswith("chat/completions") else "openai_completion"
    lines.append('  File "/usr/local/lib/python3.12/dist-packages/tensorrt_llm/serve/'
                 f'openai_server.py", line 1180, in {endpoint}\n    POST {path}')
    return orjson.dumps({"error": "\n".join(lines)})


def flat_error(body: bytes) -> bytes:
    """openai_server.py create_error_response: the flat ErrorResponse (`object`, `message`,
    `type`, `param`, `code`) with the status, where vLLM nests it under `error`."""
    try:
        err = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return body
    if not isinstance(err, dict):
        return body
    return orjson.dumps({"object": "error", "message": err.get("message"),
                         "type": err.get("type"), "param": err.get("param"),
                         "code": err.get("code")})
