"""How a whole (non-streaming) answer is asked of a worker, and how long it may take.

A worker asked for one JSON body sends nothing until the whole generation is done, so the
`timeouts.first_byte` deadline (queueing + prefill) would bound the whole generation: a long
answer (a reasoning model's 8k tokens, a long summary under load) would be a 504 although the
worker was generating all along. So, as for streams:

- A whole answer whose length is not bounded small is asked as a stream and folded
  (`canonical.Completion.fold`, the pipeline's `Opened.more`): `first_byte` bounds the wait for
  the first token, `idle` each gap after it, and nothing bounds the length but the client.
- It stays one body (cheaper: one JSON to decode) when the worker's limit on its length, the
  client's `max_tokens` or the worker protocol's default (`Backend.token_limit`), is at most
  `first_byte * DECODE_RATE` tokens. Its deadline is then `first_byte + limit / DECODE_RATE`,
  so a decode slower than the rule assumes still never cuts it.
- It stays one body whatever its length when the worker's stream cannot carry what the answer
  needs (`Backend.streams_whole` is False: prompt logprobs, best_of > n, beam search, ...), with
  the same deadline when a limit is known, else `first_byte + idle * UNBOUNDED_IDLE_GAPS`.
- It is asked as a stream whatever its length when its client's format lists every token
  (`per_token`: TGI and LMI details) and the worker's body would not show them
  (`Backend.tokens_whole` is False: Triton's one `text_output`, a plain OpenAI server's text)
  nor would the model's tokenizer split it: the fold keeps one token per chunk, as the streamed
  answer gives them (SPEC.md: ids from the worker, else the tokenizer, else -1).
"""

from __future__ import annotations

import dataclasses
import math

from adapters import base
from gateway import config
from schemas import canonical

# The slowest decode, in tokens a second per sequence, that a whole answer asked as one body is
# allowed for. Below it, an answer of `limit` tokens could not end within `first_byte + limit /
# DECODE_RATE`. 2 tokens/s is far below what any GPU worker decodes one sequence at, even
# heavily batched (tens of tokens a second), so a bounded body is never cut merely by a worker
# that is slow but busy on it; and with the default `first_byte` of 120 s a body stays the rule
# up to 240 tokens, which covers the short answers (LMI's default 30, completions' 16, the speed
# benchmark's 64) that gain most from one JSON body to decode.
DECODE_RATE = 2.0

# A body with no known limit (a chat answer that needs prompt logprobs or beam search and set
# no `max_tokens`): the worker may generate up to its context, and nothing but the client's
# disconnect bounds it. Its deadline is `first_byte` plus this many `idle` gaps: a stream would
# be cut by one gap of silence, a body that shows no progress gets ten (with the defaults,
# 720 s: past the 600 s that OpenAI's Python client waits by default, and at the rule's
# DECODE_RATE some 1,200 tokens, at a real GPU's decode rate tens of thousands), and an
# operator who raises `idle` for slow workers raises it with them.
UNBOUNDED_IDLE_GAPS = 10


def plan(backend: base.Backend, req: canonical.InferenceRequest, timeouts: config.Timeouts,
         tokenizer: bool = False) -> tuple[canonical.InferenceRequest, float]:
    """The request to send for a whole answer `req` (itself, or its stream to fold) and how long
    a non-streaming worker request may wait for its body (a streaming one waits `first_byte`
    for its first byte, whatever this says); `tokenizer`: the model's splits text into tokens."""
    if req.per_token and not tokenizer and not backend.tokens_whole(req):
        return dataclasses.replace(req, stream=True), timeouts.first_byte
    limit = backend.token_limit(req)
    if limit is not None and limit <= timeouts.first_byte * DECODE_RATE:
        return req, allowance(timeouts, limit)
    if backend.streams_whole(req):
        return dataclasses.replace(req, stream=True), timeouts.first_byte
    return req, allowance(timeouts, limit)


def allowance(timeouts: config.Timeouts, limit: int | None) -> float:
    """The deadline of a whole answer asked as one body: its first byte's, plus its decode at
    DECODE_RATE (rounded up to a whole second, so that requests share the loop's timer handle
    of each deadline, gateway.deadline.Timeouts); without a limit, UNBOUNDED_IDLE_GAPS."""
    if limit is None:
        return timeouts.first_byte + timeouts.idle * UNBOUNDED_IDLE_GAPS
    return float(math.ceil(timeouts.first_byte + limit / DECODE_RATE))
