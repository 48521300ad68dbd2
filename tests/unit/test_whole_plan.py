"""How a whole answer is asked of each worker protocol, and how long it may take (gateway.whole).

The rule: one JSON body when the worker's limit on the answer's length is at most
`first_byte * DECODE_RATE` tokens (deadline `first_byte + limit / DECODE_RATE`); a stream,
folded, when the answer may be longer; one body whatever its length when only the body carries
what the answer needs (vLLM serving_completion.py: "when n != best_of, we do not stream the
results. In addition, we do not stream the results when use beam search."; protocol.py:
"`prompt_logprobs` are not available when `stream=True`").
"""

from __future__ import annotations

import pytest

from adapters import registry
from gateway import config, whole
from schemas import canonical
from schemas import events as ev

T = config.Timeouts(first_byte=120, idle=60)
CHAT = [canonical.Message("user", "hi")]


def chat(max_tokens: int | None = None, **kw: object) -> canonical.InferenceRequest:
    return canonical.InferenceRequest(messages=CHAT, sampling=canonical.Sampling(
        max_tokens=max_tokens), **kw)  # type: ignore[arg-type]


def text(max_tokens: int | None = None, **kw: object) -> canonical.InferenceRequest:
    return canonical.InferenceRequest(prompts=["Once"], sampling=canonical.Sampling(
        max_tokens=max_tokens), **kw)  # type: ignore[arg-type]


def plan(backend: str, req: canonical.InferenceRequest) -> tuple[bool, float]:
    sent, wait = whole.plan(registry.backend(backend), req, T)
    assert sent.stream or sent is req  # a body is the client's own request, not a copy
    return sent.stream, wait


@pytest.mark.parametrize("backend", ["vllm", "trtllm", "openai"])
def test_a_bounded_small_answer_stays_one_body_with_time_for_its_decode(backend: str) -> None:
    assert whole.DECODE_RATE == 2.0
    assert plan(backend, chat(64)) == (False, 152.0)  # 120 + 64 / 2: the speed benchmark's
    assert plan(backend, chat(240)) == (False, 240.0)  # first_byte * 2 tokens: still a body
    assert plan(backend, chat(1)) == (False, 121.0)  # rounded up to a whole second
    assert plan(backend, text(30)) == (False, 135.0)


@pytest.mark.parametrize("backend", ["vllm", "trtllm", "openai"])
def test_a_longer_or_unbounded_answer_is_asked_as_a_stream(backend: str) -> None:
    assert plan(backend, chat(241)) == (True, 120.0)
    assert plan(backend, chat()) == (True, 120.0)  # chat: the context's room
    fit = text()
    fit.sampling.max_tokens_fit = True  # TGI's and LMI's "as many as fit"
    assert plan(backend, fit) == (True, 120.0)


def test_completions_without_max_tokens_are_bounded_by_the_protocol_default() -> None:
    """OpenAI's API reference and vLLM's protocol.py: `max_tokens` defaults to 16; trtllm-serve
    leaves it to the engine (openai_protocol.py CompletionRequest `max_tokens` None)."""
    assert plan("vllm", text()) == (False, 128.0)
    assert plan("openai", text()) == (False, 128.0)
    assert plan("trtllm", text()) == (True, 120.0)


def test_the_rule_follows_first_byte() -> None:
    short = config.Timeouts(first_byte=2, idle=5)
    sent, wait = whole.plan(registry.backend("vllm"), chat(4), short)
    assert (sent.stream, wait) == (False, 4.0)
    sent, wait = whole.plan(registry.backend("vllm"), chat(5), short)
    assert (sent.stream, wait) == (True, 2.0)


def _beam() -> canonical.InferenceRequest:
    req = chat()
    req.extra["use_beam_search"] = True
    return req


def _beams() -> canonical.InferenceRequest:
    """LMI's `num_beams` (seed 003), which the vLLM and trtllm backends send as beam search."""
    req = chat()
    req.sampling.num_beams = req.sampling.n = 3
    return req


def _best_of() -> canonical.InferenceRequest:
    req = text(1000)
    req.sampling.best_of = 3
    return req


@pytest.mark.parametrize("make", [
    lambda: chat(prompt_logprobs=1), lambda: text(1000, echo=True, logprobs=True, top_logprobs=1),
    _beam, _beams, _best_of])
@pytest.mark.parametrize("backend", ["vllm", "trtllm"])
def test_what_only_a_body_carries_stays_a_body(backend: str, make: object) -> None:
    req = make()  # type: ignore[operator]
    assert not registry.backend(backend).streams_whole(req)
    limit = req.sampling.max_tokens
    # with a limit: its decode's time; without: first_byte + ten idle gaps (720 s)
    assert plan(backend, req) == (False, 620.0 if limit == 1000 else 720.0)


def test_best_of_equal_to_n_streams() -> None:
    req = text(1000)
    req.sampling.n = req.sampling.best_of = 2
    assert plan("vllm", req) == (True, 120.0)


def test_tgi_and_triton_build_their_own_worker_requests() -> None:
    """TGI asks /generate_stream for a prompt's whole answer already (its `build`), /generate
    only for best_of and prompt logprobs; the deadline of a body still follows the rule."""
    tgi = registry.backend("tgi")
    assert plan("tgi", text()) == (False, 128.0)  # its 16-token default for raw prompts
    assert plan("tgi", chat(prompt_logprobs=1)) == (False, 720.0)
    assert not tgi.streams_whole(chat())
    assert plan("triton", chat()) == (False, 120.0 + 4096 / 2)  # its chat default limit


@pytest.mark.parametrize("backend", ["triton", "openai"])
def test_tokens_a_body_would_not_show_are_asked_as_a_stream(backend: str) -> None:
    """TGI and LMI details list every generated token (`per_token`); Triton's `generate` body is
    one `text_output` (tensorrt_llm/1/model.py convert_response) and a plain OpenAI server's
    body one text, where their streams send a chunk per token. Bounded small or not, such an
    answer is asked as a stream (waiting `first_byte` for its first token) and folded."""
    assert plan(backend, text(4, per_token=True)) == (True, 120.0)
    assert plan(backend, text(4)) == (False, 122.0)  # no details: one body, as before
    # with the model's tokenizer the body's text is split into its tokens: one body
    sent, wait = whole.plan(registry.backend(backend), text(4, per_token=True), T, True)
    assert (sent.stream, wait) == (False, 122.0)


def test_a_body_that_shows_its_tokens_stays_one_body() -> None:
    """vLLM (`return_token_ids` and logprobs) and trtllm-serve (logprobs, asked for
    `per_token`: PER_TOKEN_LOGPROBS) list every token in a body; so do a plain OpenAI server's
    logprobs when the client asked for them, and TGI's /generate details."""
    for backend in ("vllm", "trtllm", "tgi"):
        assert registry.backend(backend).tokens_whole(text(4, per_token=True))
        assert plan(backend, text(4, per_token=True)) == (False, 122.0)
    asked = text(4, per_token=True, logprobs=True, top_logprobs=2)
    assert plan("openai", asked) == (False, 122.0)


def test_a_folded_stream_keeps_one_token_per_chunk_for_per_token_clients() -> None:
    """A stream's text chunks without ids are a token each to TGI and LMI (their stream
    encoders write one token per chunk, id -1, SPEC.md); folded for such a client they stay
    one each, and for any other client the fold is the text alone, as before."""
    events: list[ev.Event] = [ev.TextDelta(0, " The"), ev.TextDelta(0, " answer"),
                              ev.Finish(0, "length")]
    done = canonical.Completion.fold(events, 1, per_token=True)
    c = done.choices[0]
    assert (c.text, c.token_ids, c.token_texts) == (" The answer", [-1, -1], [" The", " answer"])
    plain = canonical.Completion.fold(events).choices[0]
    assert (plain.text, plain.token_ids, plain.token_texts) == (" The answer", None, None)
