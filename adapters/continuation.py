"""Requests that continue an answer another worker started: the sans-I/O half of failover.

A worker that died mid-stream has sent `text_so_far`; another worker is asked for the rest:
for a completion, the prompt with that text appended; for a chat, that text as the start of
the assistant's turn (vLLM's `continue_final_message: true` with `add_generation_prompt:
false`, vLLM protocol.py ChatCompletionRequest; `answer_so_far` for a backend that says it
its own way: Triton's rendered prompt, TGI's final assistant message; `chat_completion` for a
worker whose chat route cannot continue a turn but whose completions route takes the chat
rendered with the model's template, trtllm-serve and plain OpenAI servers), each with what is
left of the token budget.
Only single-answer text can be continued: several choices or prompts, tool calls, echo,
prompt logprobs, structured output would each come back wrong or duplicated. Generated tokens'
ids and logprobs are the continuing worker's own for its tokens, so they stay; the gateway
drops its prompt information (it describes the continuation's prompt, not the client's).
"""

from __future__ import annotations

import dataclasses

from schemas import canonical

# Client extras that hold the whole answer to a guide (vLLM protocol.py `structured_outputs`
# and its older `guided_*` fields; TGI's front end sends a regex grammar as the first): a
# continuation would hold only the rest of the answer to it.
GUIDES = frozenset({"structured_outputs", "guided_json", "guided_regex", "guided_choice",
                    "guided_grammar", "structural_tag"})


def plain(req: canonical.InferenceRequest) -> bool:
    """Whether the answer is one run of text another worker can carry on."""
    s = req.sampling
    return (s.n == 1 and not s.best_of and not s.num_beams and req.prompt_logprobs is None
            and not req.echo and not req.tools and req.response_format is None
            and (not req.extra or GUIDES.isdisjoint(req.extra)))


def _budget(req: canonical.InferenceRequest, tokens_so_far: int) -> canonical.Sampling:
    s = req.sampling
    left = None if s.max_tokens is None else max(1, s.max_tokens - tokens_so_far)
    min_left = None if s.min_tokens is None else max(0, s.min_tokens - tokens_so_far)
    return dataclasses.replace(s, max_tokens=left, min_tokens=min_left)


def completion_possible(req: canonical.InferenceRequest) -> bool:
    """Whether `completion` gives a continuation of `req` (one text prompt, plain)."""
    prompts = req.prompts
    return req.messages is None and prompts is not None and len(prompts) == 1 \
        and isinstance(prompts[0], str) and plain(req)


def chat_possible(req: canonical.InferenceRequest) -> bool:
    """Whether `chat_prefix` gives a continuation of `req` (a plain chat)."""
    return req.messages is not None and plain(req)


def possible(req: canonical.InferenceRequest) -> bool:
    """Whether a worker that continues chats and completions alike can continue `req`."""
    return chat_possible(req) if req.messages is not None else completion_possible(req)


def completion(req: canonical.InferenceRequest, text_so_far: str,
               tokens_so_far: int) -> canonical.InferenceRequest | None:
    """The prompt plus the text so far; None unless one text prompt."""
    if not completion_possible(req):
        return None
    prompt = req.prompts[0] if req.prompts else ""
    assert isinstance(prompt, str)
    return dataclasses.replace(req, prompts=[prompt + text_so_far],
                               sampling=_budget(req, tokens_so_far))


def chat_prefix(req: canonical.InferenceRequest, text_so_far: str, tokens_so_far: int,
                flags: dict[str, object]) -> canonical.InferenceRequest | None:
    """The messages plus the text so far as the assistant's unfinished turn, with the worker's
    `flags` that make it continue that turn; None unless a plain chat."""
    if not chat_possible(req):
        return None
    assert req.messages is not None
    last = req.messages[-1] if req.messages else None
    if (req.extra.get("continue_final_message") is True and last is not None
            and last.role == "assistant" and isinstance(last.content, str)):
        # the client's own prefill, which the worker was already continuing: the text so far
        # goes on after it, in the same open turn
        messages = [*req.messages[:-1],
                    dataclasses.replace(last, content=last.content + text_so_far)]
    else:
        messages = [*req.messages, canonical.Message("assistant", text_so_far)]
    return dataclasses.replace(req, messages=messages,
                               sampling=_budget(req, tokens_so_far), extra={**req.extra, **flags})


def chat_answer(req: canonical.InferenceRequest, text_so_far: str,
                tokens_so_far: int) -> canonical.InferenceRequest | None:
    """The messages as they were, the text so far as `answer_so_far` (the backend puts it where
    its worker continues an assistant's turn); None unless a plain chat."""
    if not chat_possible(req):
        return None
    return dataclasses.replace(req, answer_so_far=text_so_far,
                               sampling=_budget(req, tokens_so_far))


def chat_completion(req: canonical.InferenceRequest, prompt: str, text_so_far: str,
                    tokens_so_far: int, flags: dict[str, object]) -> canonical.InferenceRequest:
    """A chat asked of a completions route: `prompt` (the chat rendered with the model's
    template, generation prompt added) plus the text so far, the same sampling and stops with
    what is left of the budget, the worker's `flags`; no tool choice (a plain chat has no
    tools, and completions take none). The caller checked `chat_possible`."""
    return dataclasses.replace(
        req, messages=None, prompts=[prompt + text_so_far], sampling=_budget(req, tokens_so_far),
        tool_choice=None, parallel_tool_calls=None, extra={**req.extra, **flags})


def answer(req: canonical.InferenceRequest, text_so_far: str,
           tokens_so_far: int) -> canonical.InferenceRequest | None:
    """`chat_answer` for a chat, `completion` for a prompt: for a backend that puts the text
    so far where its worker continues either."""
    if req.messages is not None:
        return chat_answer(req, text_so_far, tokens_so_far)
    return completion(req, text_so_far, tokens_so_far)
