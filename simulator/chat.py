"""`/v1/chat/completions` as vLLM 0.11 answers it: request checks, stream chunks, JSON body.

Sources: vLLM 0.11 `protocol.py` (ChatCompletionRequest validators, ChatMessage and chunk field
order) and `serving_chat.py` (role chunk per choice with top-level `prompt_token_ids`, chunks
dumped with `exclude_unset=True`, tool-call deltas, `reasoning_content`, usage chunk with
`exclude_none=True`).
"""

from __future__ import annotations

from typing import Any

import orjson

from simulator import directives, jobs, render, resume, tokens
from simulator.jobs import SimError
from simulator.settings import SimulatorSettings

_dumps = orjson.dumps


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def directive_texts(body: dict[str, Any]) -> list[str]:
    """Every message text, where directives may hide (lenient: validation comes later)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return []
    return [_text(m.get("content")) for m in msgs if isinstance(m, dict)]


def _messages(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) pairs of a valid `messages` list."""
    msgs = body.get("messages")
    if msgs is None:
        raise SimError("Field required: `messages`")
    if not isinstance(msgs, list):
        raise SimError("`messages` must be a list")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise SimError(f"`messages[{i}]` must be an object with a string `role`")
        out.append((m["role"], _text(m.get("content"))))
    return out


def _named_tool(choice: dict[str, Any], names: list[str]) -> str:
    """The function a `tool_choice` object names (vLLM check_tool_usage messages)."""
    usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
    function = choice.get("function")
    if not isinstance(function, dict):
        raise SimError(f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}")
    if "name" not in function:
        raise SimError(f"Expected field `name` in `function` in `tool_choice`! {usage}")
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise SimError(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage}")
    if name not in names:
        raise SimError(
            "The tool specified in `tool_choice` does not match any of the specified `tools`"
        )
    return name


def _tool(body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The (function, properties) every choice calls, or None when no tool is called."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto" if tools else "none")
    if choice in ("none", None):
        return None
    if tools is None:
        raise SimError("When using `tool_choice`, `tools` must be set.")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise SimError(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", '
            '"auto" or "required" are supported.'
        )
    if not isinstance(tools, list) or not all(
        isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise SimError("`tools` must be a list of function tools with a `name`")
    if not tools:
        return None
    functions = {t["function"]["name"]: t["function"] for t in tools}
    name = (
        _named_tool(choice, list(functions))
        if isinstance(choice, dict)
        else tools[0]["function"]["name"]
    )
    params = functions[name].get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    return name, props if isinstance(props, dict) else {}


def _reasoning(body: dict[str, Any], settings: SimulatorSettings, d: directives.Directives) -> int:
    """Reasoning tokens: directive, else `chat_template_kwargs.enable_thinking`, else setting."""
    if d.reasoning is not None:
        return d.reasoning
    kwargs = body.get("chat_template_kwargs")
    thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    on = settings.reasoning if thinking is None else bool(thinking)
    return directives.DEFAULT_REASONING_TOKENS if on else 0


def _logprobs(body: dict[str, Any]) -> int | None:
    """`top_logprobs` when `logprobs` is on, with vLLM's check_logprobs messages."""
    top = body.get("top_logprobs")
    top = 0 if top is None else jobs.logprobs_count(top, "top_logprobs")
    if top > 0 and not body.get("logprobs"):
        raise SimError("when using `top_logprobs`, `logprobs` must be set to true.")
    return top if body.get("logprobs") else None


def parse(
    body: dict[str, Any],
    settings: SimulatorSettings,
    faults: directives.Directives,
    header_id: str | None,
) -> jobs.Job:
    """Validate a chat request and generate every choice."""
    common = jobs.job_fields(body, settings, faults, header_id, "chatcmpl-")
    msgs = _messages(body)
    logprobs, tool = _logprobs(body), _tool(body)
    model = jobs.check_model(body, settings)
    # vLLM get_max_tokens: `max_completion_tokens or max_tokens`
    max_tokens = jobs.int_field(body, "max_completion_tokens", None) or jobs.int_field(
        body, "max_tokens", None
    )
    n, temperature, seed = jobs.sampling(body, max_tokens)
    extra = {"tool": tool, "json_props": jobs.json_props(body)}
    reasoning = _reasoning(body, settings, faults)
    # to_sampling_params: with `echo`, prompt_logprobs default to top_logprobs (0 by default)
    prompt_lp = jobs.prompt_logprobs(body, body.get("top_logprobs") or 0)
    resumed = _resumed(body, msgs, settings, faults, max_tokens, (n, seed, temperature))
    if resumed is not None:
        prompt, outcomes, faults = resumed
        prompt = jobs.truncated(prompt, body, settings, None, bos=False)
        common["faults"] = faults
    else:
        # serving_engine _normalize_prompt_text_to_input: the rendered template is truncated
        prompt = jobs.truncated(tokens.encode_chat(msgs), body, settings, None, bos=False)
        spec = jobs.gen_spec(
            body, settings, faults, len(prompt), max_tokens, reasoning=reasoning, **extra
        )
        prompt_key = tokens.digest(*(f"{r}:{t}" for r, t in msgs))
        outcomes = jobs.generate_choices(settings, spec, prompt_key, n, (seed, temperature))
    choice = body.get("tool_choice")
    return jobs.Job(
        chat=True,
        tool_choice="named" if isinstance(choice, dict) else
        "required" if choice == "required" else "auto",
        model=model,
        n=n,
        prompts=[prompt],
        prompt_texts=[""],
        outcomes=outcomes,
        logprobs=logprobs,
        prompt_logprobs=prompt_lp,
        **common,
    )


def _resumed(
    body: dict[str, Any],
    msgs: list[tuple[str, str]],
    settings: SimulatorSettings,
    faults: directives.Directives,
    max_tokens: int | None,
    sampling: tuple[int, int | None, float | None],
) -> tuple[list[int], list[tokens.Outcome], directives.Directives] | None:
    """`continue_final_message` on an assistant turn that starts this worker's own answer to
    the turns before it: that answer's remaining tokens (see simulator.resume)."""
    n, seed, temperature = sampling
    if not body.get("continue_final_message") or len(msgs) < 2 or msgs[-1][0] != "assistant":
        return None
    base, prefix = msgs[:-1], msgs[-1][1]
    if n != 1 or not prefix or body.get("tools") or body.get("response_format"):
        return None
    head = tokens.encode_chat(base)
    given = len(prefix.split())
    spec = jobs.gen_spec(
        body, settings, faults, len(head), None if max_tokens is None else max_tokens + given
    )
    key = tokens.digest(*(f"{r}:{t}" for r, t in base))
    for outcome in jobs.generate_choices(settings, spec, key, resume.MAX_CHOICES,
                                         (seed, temperature)):
        k = resume.resume_at(outcome, prefix)  # any choice of an `n` answer
        if k is not None:
            resume.trim(outcome, k, prefix)
            return head + tokens.encode(prefix), [outcome], resume.uncut(faults)
    return None


def _logprob_entry(tok: tokens.Token, k: int, as_ids: bool = False) -> dict[str, Any]:
    """ChatCompletionLogProbsContent: token, logprob, bytes, top_logprobs. With
    `return_tokens_as_token_ids` (serving_chat.py _create_chat_logprobs) tokens are
    `token_id:N`; the sampled token's bytes stay its text's, an alternative's are its
    placeholder's (_get_top_logprobs encodes the string it shows)."""
    shown = [(f"token_id:{i}", lp) for i, lp in tok.top_ids(k)] if as_ids else tok.top(k)
    top = [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in shown]
    return {
        "token": tok.shown(as_ids),
        "logprob": tok.logprob,
        "bytes": list(tok.logprob_text.encode()),
        "top_logprobs": top,
    }


def _finish(o: tokens.Outcome) -> str:
    """vLLM reports `tool_calls` when the tool call ran to its natural end."""
    return "tool_calls" if o.tool is not None and o.finish_reason == "stop" else o.finish_reason


def _delta(
    o: tokens.Outcome, tok: tokens.Token, text: str, index: int, mode: str
) -> dict[str, Any]:
    """DeltaMessage with only the fields vLLM sets for this token. A call's first delta:
    under `auto` the tool parser's, the name alone (hermes_tool_parser.py dumps
    DeltaFunctionCall(name=...) with exclude_none); `required` and a named `tool_choice`
    send name and arguments together (serving_chat.py), and a named call is numbered by
    its choice, `index=i`, up to vLLM 0.14 (chat_completion_stream_generator)."""
    if tok.kind == tokens.REASONING:
        return {"reasoning_content": text}
    call_index = index if mode == "named" else 0
    if tok.kind == tokens.TOOL_HEAD and o.tool is not None:
        function = {"name": o.tool.name}
        if mode != "auto":
            function["arguments"] = ""
        call = {"id": o.tool.id, "type": "function", "index": call_index, "function": function}
        return {"tool_calls": [call]}
    if tok.kind == tokens.TOOL_ARGS:
        return {"tool_calls": [{"index": call_index, "function": {"arguments": text}}]}
    if o.tool is not None:
        return {}  # EOS after a tool call: the finish chunk carries no text
    return {"content": text}


class ChatRender:
    """Bytes of one chat response; per chunk one small orjson.dumps between constant pieces."""

    def __init__(self, job: jobs.Job) -> None:
        self.job = job
        self.head = render.chunk_head(
            job.request_id, "chat.completion.chunk", job.created, job.model
        )
        self.prompt_len = len(job.prompts[0])

    def _usage(self, completion: int) -> bytes:
        """Continuous usage stats, when asked for."""
        if not self.job.continuous_usage:
            return b""
        return b',"usage":' + _dumps(render.usage(self.prompt_len, completion))

    def opening(self) -> bytes:
        """One role chunk per choice; the first chunks carry top-level `prompt_token_ids`."""
        ids = _dumps(self.job.prompts[0] if self.job.return_token_ids else None)
        tail = b"]" + self._usage(0) + b',"prompt_token_ids":' + ids + b"}\n\n"
        return b"".join(
            self.head
            + _dumps(
                {
                    "index": c,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
            + tail
            for c in range(self.job.n)
        )

    def step(self, index: int, k: int) -> bytes:
        """The chunk of choice `index`'s token `k` (b"" when that token shows nothing)."""
        o = self.job.outcomes[index]
        text = o.deltas[k]
        if text is None:
            return b""
        tok = o.tokens[k]
        lp = (
            None
            if self.job.logprobs is None
            else {"content": [_logprob_entry(tok, self.job.logprobs, self.job.tokens_as_ids)]}
        )
        choice: dict[str, Any] = {
            "index": index,
            "delta": _delta(o, tok, text, index, self.job.tool_choice),
            "logprobs": lp,
        }
        if k == len(o.tokens) - 1:
            choice["finish_reason"], choice["stop_reason"] = _finish(o), o.stop_reason
        else:
            choice["finish_reason"] = None
        choice["token_ids"] = [tok.id] if self.job.return_token_ids else None
        return self.head + _dumps(choice) + b"]" + self._usage(k + 1) + b"}\n\n"

    def closing(self) -> bytes:
        """The usage chunk (`choices: []`) when `include_usage`."""
        if not self.job.include_usage:
            return b""
        done = sum(len(o.tokens) for o in self.job.outcomes)
        return self.head + b'],"usage":' + _dumps(render.usage(self.prompt_len, done)) + b"}\n\n"

    def _choice(self, index: int, o: tokens.Outcome) -> dict[str, Any]:
        """ChatCompletionResponseChoice with every field, nulls included."""
        calls = (
            []
            if o.tool is None
            else [
                {
                    "id": o.tool.id,
                    "type": "function",
                    "function": {"name": o.tool.name, "arguments": o.tool.arguments},
                }
            ]
        )
        message = {
            "role": "assistant",
            "content": o.content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": calls,
            "reasoning_content": o.reasoning,
        }
        k = self.job.logprobs
        lp = None if k is None else {"content": [_logprob_entry(t, k, self.job.tokens_as_ids)
                                                 for t in o.tokens]}
        return {
            "index": index,
            "message": message,
            "logprobs": lp,
            "finish_reason": _finish(o),
            "stop_reason": o.stop_reason,
            "token_ids": o.token_ids if self.job.return_token_ids else None,
        }

    def body(self) -> bytes:
        """ChatCompletionResponse.model_dump(), compact, vLLM 0.11 field order."""
        job = self.job
        done = sum(len(o.tokens) for o in job.outcomes)
        return _dumps(
            {
                "id": job.request_id,
                "object": "chat.completion",
                "created": job.created,
                "model": job.model,
                "choices": [self._choice(i, o) for i, o in enumerate(job.outcomes)],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": render.full_usage(self.prompt_len, done),
                "prompt_logprobs": None if job.prompt_logprobs is None else
                render.prompt_logprobs(tokens.prompt_logprobs(job.prompts[0],
                                                              job.prompt_logprobs)),
                "prompt_token_ids": job.prompts[0] if job.return_token_ids else None,
                "kv_transfer_params": None,
            }
        )
