"""Turn a vLLM request body into a validated Job whose every choice is already generated.

Validation messages are vLLM 0.11's own (`protocol.py` validators, `SamplingParams._verify_args`,
`serving_engine._validate_input`), so a client sees the same 400s it would get from vLLM.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

from simulator import directives, tokens
from simulator.settings import SimulatorSettings

MAX_LOGPROBS = 20  # vLLM --max-logprobs default


class SimError(Exception):
    """A request the worker refuses before any byte: status, message and vLLM error type."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        err_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param


@dataclass(slots=True)
class Job:
    """One accepted request: how to frame it and the finished outcome of every choice."""

    chat: bool
    request_id: str
    model: str
    stream: bool
    n: int
    prompts: list[list[int]]  # prompt token ids, one list per prompt
    prompt_texts: list[str]
    outcomes: list[tokens.Outcome]  # index = prompt_idx * n + choice
    include_usage: bool = False
    continuous_usage: bool = False
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    return_token_ids: bool = False
    tokens_as_ids: bool = False  # vLLM `return_tokens_as_token_ids`: logprob tokens by id
    echo: bool = False
    ttft_s: float = 0.0
    itl_s: float = 0.0
    faults: directives.Directives = directives.NONE
    created: int = field(default_factory=lambda: int(time.time()))


def int_field(body: dict[str, Any], key: str, default: int | None) -> int | None:
    """An optional integer field (bools are not integers here)."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimError(f"`{key}` must be an integer")
    return value


def stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    """`stop` as str or list of str."""
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(s for s in stop if s)
    raise SimError("`stop` must be a string or a list of strings")


def stop_token_ids(body: dict[str, Any]) -> frozenset[int]:
    """`stop_token_ids` as a list of ints."""
    ids = body.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise SimError("`stop_token_ids` must be a list of integers")
    return frozenset(ids)


def stream_flags(body: dict[str, Any]) -> tuple[bool, bool, bool]:
    """stream, include_usage, continuous_usage with vLLM's semantics (`{}` turns usage on)."""
    opts = body.get("stream_options")
    if opts and not body.get("stream"):  # vLLM: a falsy `{}` passes this check
        raise SimError("Stream options can only be defined when `stream=True`.")
    if opts is not None and not isinstance(opts, dict):
        raise SimError("`stream_options` must be an object")
    include = opts is not None and bool(opts.get("include_usage", True))
    return (
        bool(body.get("stream")),
        include,
        include and bool(opts and opts.get("continuous_usage_stats")),
    )


def check_model(body: dict[str, Any], settings: SimulatorSettings) -> str:
    """404 for an unserved name; the reported name is vLLM's first served name."""
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise SimError("`model` must be a string")
    if settings.model_names and name and name not in settings.model_names:
        raise SimError(f"The model `{name}` does not exist.", 404, "NotFoundError", "model")
    return settings.served_name if settings.model_names or not name else name


def sampling(body: dict[str, Any], max_tokens: int | None) -> tuple[int, float | None, int | None]:
    """n, temperature, seed, checked as SamplingParams does."""
    n = int_field(body, "n", 1)
    assert n is not None
    if n < 1:
        raise SimError(f"n must be at least 1, got {n}.")
    if max_tokens is not None and max_tokens < 1:
        raise SimError(f"max_tokens must be at least 1, got {max_tokens}.")
    temperature = body.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise SimError("`temperature` must be a number")
        if temperature < 0:
            raise SimError(f"temperature must be non-negative, got {temperature}.")
    return n, temperature, int_field(body, "seed", None)


def token_limit(settings: SimulatorSettings, prompt_len: int, max_tokens: int | None) -> int:
    """Effective max_tokens, with vLLM's context-length errors."""
    cap = settings.max_model_len
    if prompt_len >= cap:
        raise SimError(
            f"This model's maximum context length is {cap} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input messages."
        )
    if max_tokens is None:
        return cap - prompt_len
    if prompt_len + max_tokens > cap:
        raise SimError(
            f"This model's maximum context length is {cap} tokens. However, you requested "
            f"{max_tokens + prompt_len} tokens ({prompt_len} tokens in the messages, "
            f"{max_tokens} tokens in the completion). Please reduce the length of the "
            "messages or completion."
        )
    return max_tokens


def choice_key(
    settings: SimulatorSettings,
    prompt_key: bytes,
    seed: int | None,
    temperature: float | None,
    index: int,
) -> bytes:
    """Greedy (temperature 0) ignores seed and choice index, as a real model would."""
    if temperature == 0:
        return tokens.digest(settings.seed, prompt_key.hex(), "greedy")
    temp = 1.0 if temperature is None else float(temperature)  # vLLM's default temperature
    return tokens.digest(settings.seed, prompt_key.hex(), seed, index, repr(temp))


def tool_call_id(key: bytes) -> str:
    """vLLM's `chatcmpl-tool-<32 hex>` id, derived from the choice key."""
    return "chatcmpl-tool-" + blake2b(key + b"tool", digest_size=16).hexdigest()


def request_id(body: dict[str, Any], header: str | None) -> str:
    """vLLM `_base_request_id`: the X-Request-Id header, else body `request_id`, else random."""
    if header:
        return header
    rid = body.get("request_id")
    return rid if isinstance(rid, str) and rid else uuid.uuid4().hex


def timing(settings: SimulatorSettings, faults: directives.Directives) -> tuple[float, float]:
    """TTFT and inter-token delay in seconds, directives over settings."""
    ttft = settings.ttft_ms if faults.ttft_ms is None else faults.ttft_ms
    itl = settings.itl_ms if faults.itl_ms is None else faults.itl_ms
    return ttft / 1000, itl / 1000


def logprobs_count(value: Any, name: str) -> int:
    """A logprobs count within vLLM's limit."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimError(f"`{name}` must be an integer")
    if value < 0:
        raise SimError(f"`{name}` must be a positive value.")
    if value > MAX_LOGPROBS:
        raise SimError(
            f"Requested sample logprobs of {value}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}"
        )
    return value


def gen_spec(
    body: dict[str, Any],
    settings: SimulatorSettings,
    faults: directives.Directives,
    prompt_len: int,
    max_tokens: int | None,
    **extra: Any,
) -> tokens.GenSpec:
    """The generation rules both endpoints share (length, EOS, stops, forced finish)."""
    natural = settings.tokens if faults.tokens is None else faults.tokens
    return tokens.GenSpec(
        tokens=max(natural, int_field(body, "min_tokens", 0) or 0),
        max_tokens=token_limit(settings, prompt_len, max_tokens),
        ignore_eos=bool(body.get("ignore_eos")),
        finish=faults.finish,
        stop=stop_strings(body),
        stop_token_ids=stop_token_ids(body),
        **extra,
    )


def job_fields(
    body: dict[str, Any],
    settings: SimulatorSettings,
    faults: directives.Directives,
    header_id: str | None,
    id_prefix: str,
) -> dict[str, Any]:
    """Job fields both endpoints fill the same way (stream flags are validated first)."""
    stream, include_usage, continuous = stream_flags(body)
    ttft, itl = timing(settings, faults)
    return {
        "request_id": id_prefix + request_id(body, header_id),
        "stream": stream,
        "include_usage": include_usage,
        "continuous_usage": continuous,
        "return_token_ids": bool(body.get("return_token_ids")),
        "tokens_as_ids": bool(body.get("return_tokens_as_token_ids")),
        "ttft_s": ttft,
        "itl_s": itl,
        "faults": faults,
    }


def generate_choices(
    settings: SimulatorSettings,
    spec: tokens.GenSpec,
    prompt_key: bytes,
    n: int,
    sampling_args: tuple[int | None, float | None],
) -> list[tokens.Outcome]:
    """The n choices of one prompt; `sampling_args` is (seed, temperature)."""
    seed, temperature = sampling_args
    outcomes = []
    for i in range(n):
        key = choice_key(settings, prompt_key, seed, temperature, i)
        outcomes.append(tokens.generate(spec, key, tool_call_id(key) if spec.tool else ""))
    return outcomes
