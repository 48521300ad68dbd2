"""LMI whole answers and error bodies: rolling batch, dynamic batch, chat, SageMaker completion.

Byte sources: DJL Serving v0.36.0 `djl_python/output_formatter.py` (`_json_output_formatter`,
its best_of variant, `get_details_dict`, `_json_chat_output_formatter`: Python `json.dumps`,
default separators), `request_io.py` (Token.as_dict / as_tgi_dict), `outputs.py`
(`Output._encode_json`, `Output.error` for dynamic batching), Java `Request.addResponse` (the
424 body); seed 002 for the SageMaker vLLM text completion (vLLM's compact JSON); seed 003 for
the non-stream generation-failure body. Choices where these disagree: SPEC.md and
wire-formats.md section 12.
"""

from __future__ import annotations

from typing import Any

import orjson

from adapters import base
from adapters.frontends import lmi_json
from adapters.frontends.lmi_params import LmiState
from adapters.frontends.openai_encode import prompt_logprobs, uncovered
from schemas import canonical, errors
from schemas import events as ev

# LMI's finish reasons (seed 000 / 003 tables: length, eos_token, stop_sequence; DJL's error).
# SPEC.md: a matched stop string is `stop_sequence` as the seeds say (DJL's vLLM path would
# report eos_token); a stop token is an end of sequence.
FINISH: dict[str, str] = {
    "eos": "eos_token", "stop_token": "eos_token", "stop_string": "stop_sequence",
    "length": "length", "tool_calls": "tool_calls", "content_filter": "content_filter",
    "abort": "abort", "error": "error",
}
# vLLM's own names, for seed 002's SageMaker vLLM completion format.
VLLM_FINISH: dict[str, str] = {
    "eos": "stop", "stop_token": "stop", "stop_string": "stop", "length": "length",
    "tool_calls": "tool_calls", "content_filter": "content_filter", "abort": "abort",
    "error": "error",
}
CHAT_ID = "chatcmpl-"
COMPLETION_ID = "cmpl-"
# DJL's stand-in token (rolling_batch_vllm_utils.py: `Token(id=-1, text="")` when a step has no
# token) and the id written where neither the worker nor the model's tokenizer gave one:
# "unknown" (SPEC.md; adapters/tokens.py).
UNKNOWN_ID = -1


def finish_name(f: ev.Finish | None) -> str | None:
    return FINISH[f.reason] if f is not None else None


def token(tid: int, text: str, logprob: float | None, tgi: bool) -> dict[str, Any]:
    """request_io.Token.as_dict, or as_tgi_dict under tgi_compat."""
    if tgi:
        return {"id": tid, "text": text, "logprob": logprob}
    return {"id": tid, "text": text, "log_prob": logprob}


def top_tokens(lp: ev.TokenLogprob | None, tid: int, tgi: bool) -> list[dict[str, Any]]:
    """The alternatives at one position, in the worker's order (DJL lists vLLM's logprobs dict)."""
    if lp is None:
        return []
    return [token(a.id if a.id is not None else (tid if a.token == lp.token else UNKNOWN_ID),
                  a.token, a.logprob, tgi) for a in lp.top]


def choice_tokens(c: canonical.Choice) -> list[tuple[int, str, ev.TokenLogprob | None]]:
    ids, lps, texts = c.token_ids or [], c.logprobs or [], c.token_texts or []
    return [(ids[i] if i < len(ids) else UNKNOWN_ID,
             lps[i].token if i < len(lps) else (texts[i] if i < len(texts) else ""),
             lps[i] if i < len(lps) else None) for i in range(max(len(ids), len(lps)))]


def _prefill(st: LmiState, done: canonical.Completion, choice: int) -> list[dict[str, Any]]:
    """get_prompt_tokens_as_dict: one token per prompt id; vLLM has no logprob (and we no text)
    for the first (rolling_batch_vllm_utils.py: log_prob None at index 0)."""
    return [token(tid, lp.token if lp else "", lp.logprob if lp else None, st.tgi_compat)
            for tid, lp in done.prompt_tokens(choice)]


def _sequence(st: LmiState, done: canonical.Completion, c: canonical.Choice) -> dict[str, Any]:
    """get_sequence_details: finish_reason, generated_tokens, tokens, prefill, top_tokens."""
    toks = choice_tokens(c)
    single = len(done.choices) == 1 and done.usage is not None
    count = len(toks) or (done.usage.completion_tokens if single and done.usage else 0)
    out: dict[str, Any] = {"finish_reason": finish_name(c.finish), "generated_tokens": count,
                           "tokens": [token(t[0], t[1], t[2].logprob if t[2] else None,
                                            st.tgi_compat) for t in toks]}
    if st.prefill:
        out["prefill"] = _prefill(st, done, c.index)
    if st.top_n_tokens:
        out["top_tokens"] = [top_tokens(t[2], t[0], st.tgi_compat) for t in toks]
    return out


def rolling_body(st: LmiState, done: canonical.Completion) -> bytes:
    """_json_output_formatter (or its best_of variant): list-wrapped under tgi_compat."""
    best = done.choices[0]  # DJL: vLLM's outputs[0] is the best sequence
    body: Any = {"generated_text": st.prefix(0) + best.text}
    if st.multi:
        details: dict[str, Any] = {"inputs": st.prompts[0], **_sequence(st, done, best)}
        others = [{**_sequence(st, done, c), "generated_text": st.prefix(0) + c.text}
                  for c in done.choices[1:]]
        if others:
            details["best_of_sequences"] = others
        body["details"] = details
    elif st.details:
        seq = _sequence(st, done, best)
        body["details"] = {"finish_reason": seq.pop("finish_reason"),
                           "generated_tokens": seq.pop("generated_tokens"),
                           "inputs": st.prompts[0], **seq}
    return lmi_json.dumps([body] if st.tgi_compat else body)


def dynamic_body(st: LmiState, done: canonical.Completion) -> bytes:
    """Seed 003 dynamic batch: one {"generated_text"} per input, in `Output._encode_json`'s
    pretty form; with n > 1 the first sequence of each input."""
    out = [{"generated_text": st.prefix(i * st.n) + done.choice(i * st.n).text}
           for i in range(len(st.prompts))]
    return lmi_json.pretty_compact(out)


def _code_points(text: str) -> list[int] | None:
    """Seed 000 "bytes representation of the token", as DJL writes it: the text's Unicode
    code points (output_formatter.py `[ord(c) for c in t.text]`; wire-formats.md 5.6), not
    its UTF-8 bytes, and None for an empty token."""
    return [ord(c) for c in text] if text else None


def chat_logprob(t: ev.TokenLogprob) -> dict[str, Any]:
    """Seed 000 Logprobs content entry. `top_logprobs` holds the worker's alternatives, or the
    sampled token alone as DJL writes it ("Currently only support 1 top_logprobs"), with the
    token text in `token` (SPEC.md; DJL's stream path writes the logprob there)."""
    tops = t.top or [ev.TopLogprob(t.token, t.logprob or 0.0)]
    return {"token": t.token, "logprob": t.logprob, "bytes": _code_points(t.token),
            "top_logprobs": [{"token": a.token, "logprob": a.logprob,
                              "bytes": _code_points(a.token)} for a in tops]}


def _message(c: canonical.Choice, meta: base.ResponseMeta) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant"}
    if c.reasoning is not None:
        msg["reasoning_content"] = c.reasoning
    msg["content"] = c.text if c.text or not c.tool_calls else None
    if c.tool_calls:
        msg["tool_calls"] = [{"id": meta.call_id(c.index, i, t.id, t.name), "type": "function",
                              "function": {"name": t.name, "arguments": t.arguments}}
                             for i, t in enumerate(c.tool_calls)]
    return msg


def usage_counts(done: canonical.Completion) -> dict[str, int]:
    """Seed 000 / 002 key order: prompt, completion, total."""
    u = done.usage or ev.Usage(0, sum(len(c.token_ids or ()) for c in done.choices))
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens}


def chat_body(req: canonical.InferenceRequest, done: canonical.Completion,
              meta: base.ResponseMeta) -> bytes:
    """_json_chat_output_formatter: no `model`, LMI finish reasons, Python separators."""
    choices = []
    for c in done.choices:
        lp = {"content": [chat_logprob(t) for t in c.logprobs or ()]} if req.logprobs else None
        choices.append({"index": c.index, "message": _message(c, meta), "logprobs": lp,
                        "finish_reason": finish_name(c.finish)})
    return lmi_json.dumps({"id": CHAT_ID + meta.id, "object": "chat.completion",
                           "created": meta.created, "choices": choices,
                           "usage": usage_counts(done)})


# Seed 002: a `prompt` answer's `model` is "always "/opt/ml/model" for SageMaker-hosted
# models" (the path vLLM serves the model from in the container), whatever the model's name.
SAGEMAKER_MODEL = "/opt/ml/model"


def completion_logprobs(lps: list[ev.TokenLogprob] | None, offset: int) -> dict[str, Any]:
    """vLLM CompletionLogProbs, in its field order; `text_offset` runs on from `offset`."""
    offsets, values, tokens, tops = [], [], [], []
    for t in lps or ():
        offsets.append(offset)
        offset += len(t.token)
        values.append(t.logprob)
        tokens.append(t.token)
        tops.append({a.token: a.logprob for a in t.top} if t.top else None)
    return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens,
            "top_logprobs": tops}


def completion_body(req: canonical.InferenceRequest, done: canonical.Completion,
                    meta: base.ResponseMeta) -> bytes:
    """Seed 002 text completion (vLLM's CompletionResponse, compact as vLLM writes it)."""
    prompts = {p.choice: p for p in done.prompt}
    choices = []
    for c in done.choices:
        out: dict[str, Any] = {
            "index": c.index, "text": c.text,
            "logprobs": completion_logprobs(
                c.logprobs, uncovered(c.text, c.logprobs) if req.echo else 0)
            if req.logprobs else None,
            "finish_reason": VLLM_FINISH[c.finish.reason] if c.finish else None,
            "stop_reason": c.finish.matched if c.finish else None}
        if req.token_ids:
            out["token_ids"] = c.token_ids
        out["prompt_logprobs"] = (prompt_logprobs(prompts.get(c.index))
                                  if req.prompt_logprobs is not None else None)
        choices.append(out)
    return orjson.dumps({
        "id": COMPLETION_ID + meta.id, "object": "text_completion", "created": meta.created,
        "model": SAGEMAKER_MODEL, "choices": choices, "service_tier": None,
        "system_fingerprint": None,
        "usage": {**usage_counts(done), "prompt_tokens_details": None},
        "kv_transfer_params": None})


# ---- errors ----

def error_status(exc: errors.GatewayError) -> int:
    """SPEC.md: request validation failures (ours or the worker's) answer 424 as seed 003 says;
    a worker that is down gives its 502/503; the rest keep their own status."""
    if isinstance(exc, errors.RequestError | errors.UpstreamRejected) and exc.status in (400, 422):
        return 424
    return exc.status


class SchemaNote(base.Note):
    """The schema of a body refused while parsing, when known before its validation (a list of
    `inputs`: the dynamic-batch schema), chained as the refusal's cause for render_error."""

    def __init__(self, state: LmiState):
        super().__init__(state.schema)
        self.state = state


def render_error(exc: errors.GatewayError, st: LmiState | None) -> base.Rendered:
    """The error body of the request's schema (`st`, None when the body never parsed).

    Every error before the first byte, the worker's refusals (4xx), failures (5xx) and
    malformed answers included, is `{"error": "<message>", "code": N}` with the message kept
    (SPEC.md: "a worker that is down or refuses before the first byte gives 502/503 in that
    same body"; issue 12). Seed 003's `generated_text` shell with `finish_reason: error` has
    no room for the message, so it is written only where the seed requires it: as the last
    line of a stream that fails after its first token (lmi_encode)."""
    status = error_status(exc)
    headers = base.retry_headers(exc)
    message = exc.message
    if isinstance(exc, errors.Unsupported) and exc.field and st is not None:
        # a worker's refusal names its own field: say which parameter the client wrote
        if (name := st.client_field(exc.field)) is not None:
            message = message.replace(f"`{exc.field}`", f"`{name}`", 1)
    if st is not None and st.schema == "dynamic":
        body = lmi_json.pretty_compact(
            {"code": status, "message": "invoke handler failure", "error": message})
    else:
        body = lmi_json.gson_error(message, status)
    return base.Rendered(status, body, headers=headers)
