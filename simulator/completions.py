"""`/v1/completions` as vLLM 0.11 answers it: prompt forms, echo, stream chunks, JSON body.

Sources: vLLM 0.11 `protocol.py` (CompletionRequest: `max_tokens` defaults to 16, prompt as
str | list[str] | list[int] | list[list[int]]) and `serving_completion.py` (chunks dumped with
`exclude_unset=False`, so every field and `"usage":null` appear; choice index =
prompt_idx * n + i; echo prepends the prompt to each choice's first chunk; `prompt_token_ids`
only on a choice's first chunk).
"""

from __future__ import annotations

from typing import Any

import orjson

from simulator import directives, jobs, render, resume, tokens
from simulator.jobs import SimError
from simulator.settings import SimulatorSettings

_dumps = orjson.dumps
_DEFAULT_MAX_TOKENS = 16  # CompletionRequest.max_tokens default


def directive_texts(body: dict[str, Any]) -> list[str]:
    """The text prompts, where directives may hide (lenient: validation comes later)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        return [p for p in prompt if isinstance(p, str)]
    return []


def _is_ids(value: Any) -> bool:
    """A non-empty list of token ids."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
    )


def _prompts(
    body: dict[str, Any], settings: SimulatorSettings, max_tokens: int | None
) -> list[tuple[str, list[int]]]:
    """(text, ids) per prompt; text prompts get BOS (`add_special_tokens=True`). With
    `truncate_prompt_tokens` a text prompt keeps its text (echo shows it whole) and a token
    prompt's text is its kept ids decoded (renderer.py); the limit is max_model_len less
    max_tokens (serving_completion.py _build_render_config)."""
    prompt = body.get("prompt")
    if prompt is None:
        raise SimError("At least one of `prompt` or `prompt_embeds` must be set.")
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif _is_ids(prompt):
        items = [prompt]
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, str) or _is_ids(p) for p in prompt)
    ):
        items = prompt
    else:
        raise SimError(
            "`prompt` must be a string, a list of strings, a list of token ids "
            "or a list of token id lists, and not empty"
        )
    limit = settings.max_model_len - (max_tokens or 0)
    out = []
    for p in items:
        if isinstance(p, str):
            ids = jobs.truncated([tokens.BOS_ID, *tokens.encode(p)], body, settings, limit, True)
            out.append((p, ids))
        else:
            ids = jobs.truncated(p, body, settings, limit, False)
            out.append((tokens.decode(ids), ids))
    return out


def parse(
    body: dict[str, Any],
    settings: SimulatorSettings,
    faults: directives.Directives,
    header_id: str | None,
) -> jobs.Job:
    """Validate a completions request and generate every prompt x choice."""
    common = jobs.job_fields(body, settings, faults, header_id, "cmpl-")
    raw_lp = body.get("logprobs")
    logprobs = None if raw_lp is None else jobs.logprobs_count(raw_lp, "logprobs")
    prompt_lp = jobs.prompt_logprobs(body, logprobs)
    model = jobs.check_model(body, settings)
    has_max = "max_tokens" in body
    max_tokens = jobs.int_field(body, "max_tokens", None) if has_max else _DEFAULT_MAX_TOKENS
    prompts = _prompts(body, settings, max_tokens)
    echo = bool(body.get("echo"))
    echo_only = echo and max_tokens == 0  # to_sampling_params: one token is sampled, unshown
    max_tokens = 1 if echo_only else max_tokens
    n, temperature, seed = jobs.sampling(body, max_tokens)
    json_props = jobs.json_props(body)
    resumed = None
    if len(prompts) == 1 and n == 1 and prompts[0][0] and not echo and json_props is None:
        resumed = _resumed(body, prompts[0][0], settings, faults, max_tokens, (seed, temperature))
    if resumed is not None:
        outcome, common["faults"] = resumed
        return jobs.Job(
            chat=False, model=model, n=1, prompts=[prompts[0][1]],
            prompt_texts=[prompts[0][0]], outcomes=[outcome], logprobs=logprobs,
            prompt_logprobs=prompt_lp, **common,
        )
    outcomes = []
    for text, ids in prompts:
        spec = jobs.gen_spec(body, settings, faults, len(ids), max_tokens, json_props=json_props)
        key = tokens.digest(text if text else ids)
        outcomes += jobs.generate_choices(settings, spec, key, n, (seed, temperature))
    return jobs.Job(
        chat=False,
        model=model,
        n=n,
        prompts=[ids for _, ids in prompts],
        prompt_texts=[text for text, _ in prompts],
        outcomes=outcomes,
        logprobs=logprobs,
        prompt_logprobs=prompt_lp,
        echo=echo,
        echo_only=echo_only,
        **common,
    )


def _resumed(
    body: dict[str, Any],
    prompt: str,
    settings: SimulatorSettings,
    faults: directives.Directives,
    max_tokens: int | None,
    sampling: tuple[int | None, float | None],
) -> tuple[tokens.Outcome, directives.Directives] | None:
    """A prompt that ends with the start of this worker's own answer to the text before it:
    that answer's remaining tokens (see simulator.resume). Cut points are tried from the end;
    a candidate is generated in full only when its first token matches."""
    seed, temperature = sampling
    for base, given in resume.splits(prompt):
        key = jobs.choice_key(settings, tokens.digest(base), seed, temperature, 0)
        if not given.startswith(resume.first_word(key)):
            continue
        words = len(given.split())
        limit = None if max_tokens is None else max_tokens + words
        spec = jobs.gen_spec(body, settings, faults, 1 + len(tokens.encode(base)), limit)
        outcome = tokens.generate(spec, key)
        k = resume.resume_at(outcome, given)
        if k is not None:
            resume.trim(outcome, k, given)
            return outcome, resume.uncut(faults)
    return None


Step = tuple[str, float | None, dict[str, float] | None]  # token, its logprob, top logprobs


def _out_steps(toks: list[tokens.Token], k: int, as_ids: bool) -> list[Step]:
    """Generated tokens; each top_logprobs dict holds the sampled token first and, as it is
    the most likely one, k entries in all (one for k = 0): _make_logprob_dict lists a sampled
    token among the top k once, and _create_completion_logprobs keeps at most k + 1."""
    n = max(k, 1)
    return [
        (
            t.shown(as_ids),
            t.logprob,
            {f"token_id:{i}": lp for i, lp in t.top_ids(n)} if as_ids else dict(t.top(n)),
        )
        for t in toks
    ]


def _prompt_steps(
    ids: list[int], plp: list[tokens.PromptStep | None], k: int, as_ids: bool
) -> list[Step]:
    """Echoed prompt tokens from their prompt logprobs: the first has none (its text is
    tokenizer.decode's), later ones show their first k + 1 entries (_create_completion_logprobs)."""
    def name(i: int) -> str:
        return f"token_id:{i}" if as_ids else tokens.token_text(i)

    return [
        (name(i), None, None) if step is None
        else (name(i), step[0][1], {name(t): lp for t, lp, _ in step[: k + 1]})
        for i, step in zip(ids, plp, strict=True)
    ]


def _logprobs(steps: list[Step], offset: int) -> dict[str, Any]:
    """CompletionLogProbs. As in vLLM's _create_completion_logprobs the offsets count the token
    strings' lengths (`token_id:N` ones with `return_tokens_as_token_ids`, `<s>` for BOS)."""
    offsets = []
    for tok, _, _ in steps:
        offsets.append(offset)
        offset += len(tok)
    return {
        "text_offset": offsets,
        "token_logprobs": [lp for _, lp, _ in steps],
        "tokens": [tok for tok, _, _ in steps],
        "top_logprobs": [top for _, _, top in steps],
    }


class CompletionRender:
    """Bytes of one completions response; per chunk one small orjson.dumps."""

    def __init__(self, job: jobs.Job) -> None:
        self.job = job
        self.head = render.chunk_head(job.request_id, "text_completion", job.created, job.model)
        self.offsets = [0] * len(job.outcomes)  # vLLM previous_text_lens
        k = job.prompt_logprobs
        self.plp = None if k is None else [tokens.prompt_logprobs(ids, k) for ids in job.prompts]

    def opening(self) -> bytes:
        """Completions have no role chunk."""
        return b""

    def _tail(self, prompt: int, k: int) -> bytes:
        """`usage`: null, or continuous stats with their null `prompt_tokens_details`."""
        if not self.job.continuous_usage:
            return b'],"usage":null}\n\n'
        stats = render.full_usage(len(self.job.prompts[prompt]), k + 1)
        return b'],"usage":' + _dumps(stats) + b"}\n\n"

    def _steps(self, p: int, toks: list[tokens.Token], echo: bool) -> list[Step]:
        """Logprob steps of `toks`, behind the prompt's when it is echoed (vLLM joins
        prompt_logprobs and the output's); with max_tokens 0 only the prompt's."""
        job = self.job
        assert job.logprobs is not None
        out = [] if job.echo_only else _out_steps(toks, job.logprobs, job.tokens_as_ids)
        if not echo or self.plp is None:
            return out
        return _prompt_steps(job.prompts[p], self.plp[p], job.logprobs, job.tokens_as_ids) + out

    def step(self, index: int, k: int) -> bytes:
        """The chunk of choice `index`'s token `k`; with echo the first one starts with the
        prompt, its ids and its logprobs (completion_stream_generator)."""
        job, o = self.job, self.job.outcomes[index]
        tok, text, p = o.tokens[k], o.deltas[k] or "", index // job.n
        echo = job.echo and k == 0
        lp = None
        if job.logprobs is not None:
            lp = _logprobs(self._steps(p, [tok], echo), self.offsets[index])
        self.offsets[index] += len(text)  # the output's text only, as previous_text_lens
        if echo:
            text = job.prompt_texts[p] + ("" if job.echo_only else text)
        last = k == len(o.tokens) - 1
        choice = {
            "index": index,
            "text": text,
            "logprobs": lp,
            "finish_reason": o.finish_reason if last else None,
            "stop_reason": o.stop_reason if last else None,
            "prompt_token_ids": job.prompts[p] if k == 0 and (job.return_token_ids or echo)
            else None,
            "token_ids": [tok.id] if job.return_token_ids else None,
        }
        return self.head + _dumps(choice) + self._tail(p, k)

    def closing(self) -> bytes:
        """The usage chunk (`choices: []`, nulls dropped) when `include_usage`."""
        if not self.job.include_usage:
            return b""
        return self.head + b'],"usage":' + _dumps(self._usage()) + b"}\n\n"

    def _usage(self) -> dict[str, int]:
        """Each prompt counted once, every choice's tokens counted (with max_tokens 0 and
        echo too: the one sampled token counts although it is not shown)."""
        prompt = sum(len(ids) for ids in self.job.prompts)
        return render.usage(prompt, sum(len(o.tokens) for o in self.job.outcomes))

    def _choice(self, index: int, o: tokens.Outcome) -> dict[str, Any]:
        """CompletionResponseChoice with every field, nulls included; logprobs offsets start
        at 0, over the prompt's tokens too when it is echoed."""
        job = self.job
        p = index // job.n
        prefix = job.prompt_texts[p] if job.echo else ""
        text = prefix + ("" if job.echo_only else o.content or "")
        lp = None if job.logprobs is None else _logprobs(self._steps(p, o.tokens, job.echo), 0)
        return {
            "index": index,
            "text": text,
            "logprobs": lp,
            "finish_reason": o.finish_reason,
            "stop_reason": o.stop_reason,
            "token_ids": o.token_ids if job.return_token_ids else None,
            "prompt_logprobs": None if self.plp is None else render.prompt_logprobs(self.plp[p]),
            "prompt_token_ids": job.prompts[p] if job.return_token_ids else None,
        }

    def body(self) -> bytes:
        """CompletionResponse.model_dump(), compact, vLLM 0.11 field order."""
        job = self.job
        return _dumps(
            {
                "id": job.request_id,
                "object": "text_completion",
                "created": job.created,
                "model": job.model,
                "choices": [self._choice(i, o) for i, o in enumerate(job.outcomes)],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": {**self._usage(), "prompt_tokens_details": None},
                "kv_transfer_params": None,
            }
        )
