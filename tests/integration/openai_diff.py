"""Normalising OpenAI-protocol answers so that a worker's and the gateway's can be compared.

What a client reads is kept: the status and error `param`; per choice, in index order, the
text, reasoning, tool calls, finish and stop reason, log probs and token ids; usage numbers;
for streams the chunk sequence shape (role chunk first, one finish per choice, usage chunk with
empty choices last, `[DONE]`), and per-chunk usage where the client asked for it. What a
re-encoding proxy may write differently is dropped: ids, `created`, the model name, key order,
keys whose value is null or empty (vLLM writes every optional key, trtllm-serve none), where the
finish reason rides (on the last token's chunk or a chunk of its own) and how text is cut into
chunks. The reasons are in the module docstring of test_differential_openai.py.
"""

from __future__ import annotations

from typing import Any

import orjson

# Keys that name or time an answer, not what it says.
_VOLATILE = frozenset(("id", "created", "model", "system_fingerprint"))


def _present(obj: dict[str, Any]) -> dict[str, Any]:
    """The keys whose value says something: null, [] and {} are absent."""
    return {k: v for k, v in obj.items() if v not in (None, [], {})}


def error(status: int, body: bytes) -> dict[str, Any]:
    """An error: its status and, where the worker names one, the `param`. vLLM nests the
    OpenAI object, trtllm-serve writes it flat or as `{"error": "<str>"}`."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {"status": status}
    inner = data.get("error", data) if isinstance(data, dict) else {}
    return {"status": status, "param": inner.get("param") if isinstance(inner, dict) else None}


def as_worker_says(worker: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """The gateway's answer, its error `param` unread where the worker names none (vLLM and
    trtllm-serve leave it null for their validators' errors; the gateway names the field)."""
    if "param" in gateway and worker.get("param") is None:
        return {**gateway, "param": None}
    return gateway


def _chat_logprobs(lp: Any) -> list[Any]:
    content = (lp or {}).get("content") or []
    return [(t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
            for t in content]


def _text_logprobs(lp: Any) -> dict[str, list[Any]]:
    lp = lp or {}
    return {k: list(lp.get(k) or []) for k in ("tokens", "token_logprobs", "top_logprobs",
                                              "text_offset")}


def _usage(u: Any) -> tuple[int, int, int] | None:
    if not u:
        return None
    return u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]


def whole(status: int, body: bytes) -> dict[str, Any]:
    """A non-streamed answer."""
    if status >= 400:
        return error(status, body)
    data = orjson.loads(body)
    choices = []
    for c in data["choices"]:
        out: dict[str, Any] = {"index": c["index"], "finish_reason": c.get("finish_reason"),
                               "stop_reason": c.get("stop_reason"),
                               "token_ids": c.get("token_ids") or None}
        if "message" in c:
            # trtllm-serve writes `reasoning_content: ""` without a reasoning parser and
            # `content: ""` beside tool calls (postprocess_handlers.py
            # chat_response_post_processor), where OpenAI's form is null: the same answer
            m = {k: v for k, v in _present(c["message"]).items()
                 if not (v == "" and (k.startswith("reasoning")
                                      or (k == "content" and c["message"].get("tool_calls"))))}
            out["message_keys"] = sorted(m)
            out["content"] = m.get("content")
            out["reasoning"] = m.get("reasoning_content", m.get("reasoning"))
            out["tool_calls"] = [(t["type"], t["function"]["name"], t["function"]["arguments"])
                                 for t in m.get("tool_calls") or ()]
            out["logprobs"] = _chat_logprobs(c.get("logprobs"))
        else:
            out["text"] = c["text"]
            out["logprobs"] = _text_logprobs(c.get("logprobs"))
        choices.append(out)
    keys = sorted(set(_present(data)) - _VOLATILE)
    return {"status": status, "object": data["object"], "keys": keys, "choices": choices,
            "usage": _usage(data.get("usage"))}


def events(body: bytes) -> tuple[list[Any], bool]:
    """The SSE payloads, and whether the last event is `data: [DONE]`."""
    parts = [p for p in body.split(b"\n\n") if p.strip()]
    payloads = [p.strip().removeprefix(b"data: ") for p in parts]
    done = bool(payloads) and payloads[-1] == b"[DONE]"
    return [orjson.loads(p) for p in payloads if p != b"[DONE]"], done


def stream(status: int, body: bytes) -> dict[str, Any]:
    """A streamed answer: what each choice said, then the shape of the sequence."""
    if status >= 400:
        return error(status, body)
    chunks, done = events(body)
    per: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    usage_chunks, errors, continuous = [], [], []
    for ch in chunks:
        if "error" in ch:
            errors.append(ch["error"].get("param"))
            continue
        if not ch["choices"]:
            usage_chunks.append(_usage(ch.get("usage")))
            continue
        if ch.get("usage"):
            continuous.append(ch["usage"]["prompt_tokens"])
        for c in ch["choices"]:
            i = c["index"]
            if i not in per:
                order.append(i)
                per[i] = {"first": None, "text": "", "reasoning": "", "tools": {},
                          "finish": [], "stop_reason": None, "logprobs": [], "token_ids": []}
            _fold(per[i], c)
    return {"status": status, "done": done, "object": {ch.get("object") for ch in chunks},
            "first_seen": order, "choices": [per[i] for i in sorted(per)],
            "usage_chunks": usage_chunks, "errors": errors,
            "continuous_prompt_tokens": sorted(set(continuous))}


def _fold(acc: dict[str, Any], c: dict[str, Any]) -> None:
    """One chunk's choice into its choice's running account."""
    d = c.get("delta")
    if d is not None:
        if acc["first"] is None:
            acc["first"] = d.get("role")
        acc["text"] += d.get("content") or ""
        acc["reasoning"] += d.get("reasoning_content") or d.get("reasoning") or ""
        for t in d.get("tool_calls") or ():
            cur = acc["tools"].setdefault(t["index"], ["", ""])
            fn = t.get("function") or {}
            cur[0] += fn.get("name") or ""
            cur[1] += fn.get("arguments") or ""
        acc["logprobs"] += _chat_logprobs(c.get("logprobs"))
    else:
        acc["text"] += c.get("text") or ""
        for k, v in _text_logprobs(c.get("logprobs")).items():
            acc.setdefault("lp_" + k, []).extend(v)
    if c.get("finish_reason") is not None:
        acc["finish"].append(c["finish_reason"])
        acc["stop_reason"] = c.get("stop_reason")
    acc["token_ids"] += c.get("token_ids") or []
