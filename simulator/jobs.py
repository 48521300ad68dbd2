"""Turn a vLLM request body into a validated Job whose every choice is already generated.

Validation messages are vLLM 0.11's own (`protocol.py` validators, `SamplingParams._verify_args`,
`serving_engine._validate_input`), so a client sees the same 400s it would get from vLLM.
"""

from __future__ import annotations

import json
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
    prompt_logprobs: int | None = None  # vLLM `prompt_logprobs`; None: not asked
    return_token_ids: bool = False
    tokens_as_ids: bool = False  # vLLM `return_tokens_as_token_ids`: logprob tokens by id
    echo: bool = False
    echo_only: bool = False  # echo with max_tokens 0: the prompt is the whole answer
    tool_choice: str = "auto"  # chat: "auto", "required" or "named" (how calls stream)
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
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise SimError("`stop` must be a string or a list of strings")
    if not all(stops):  # SamplingParams._verify_args
        raise SimError("stop cannot contain an empty string.")
    return tuple(stops)


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
    for key in ("presence_penalty", "frequency_penalty"):  # _verify_args, in its order
        penalty = number_field(body, key)
        if penalty is not None and not -2 <= penalty <= 2:
            raise SimError(f"{key} must be in [-2, 2], got {penalty}.")
    temperature = number_field(body, "temperature")
    if temperature is not None and temperature < 0:
        raise SimError(f"temperature must be non-negative, got {temperature}.")
    top_p = number_field(body, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise SimError(f"top_p must be in (0, 1], got {top_p}.")
    return n, temperature, int_field(body, "seed", None)


def number_field(body: dict[str, Any], key: str) -> float | None:
    """An optional number field (bools are not numbers here)."""
    value = body.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise SimError(f"`{key}` must be a number")
    return value


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


def logprobs_count(value: Any, name: str, kind: str = "sample") -> int:
    """A logprobs count within vLLM's limit."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimError(f"`{name}` must be an integer")
    if value < 0:
        raise SimError(f"`{name}` must be a positive value.")
    if value > MAX_LOGPROBS:
        raise SimError(
            f"Requested {kind} logprobs of {value}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}"
        )
    return value


def prompt_logprobs(body: dict[str, Any], echo_default: Any) -> int | None:
    """`prompt_logprobs`, else with `echo` the sample count (to_sampling_params), with the
    check_logprobs validator's messages; -1 (the whole vocabulary) is over the limit."""
    value = body.get("prompt_logprobs")
    if value is None:
        return echo_default if body.get("echo") else None
    if isinstance(value, int) and not isinstance(value, bool):
        if body.get("stream") and (value > 0 or value == -1):
            raise SimError("`prompt_logprobs` are not available when `stream=True`.")
        if value < -1:
            raise SimError("`prompt_logprobs` must be a positive value or -1.")
        value = len(tokens.VOCAB) if value == -1 else value
    return logprobs_count(value, "prompt_logprobs", "prompt")


_FORMATS = ("text", "json_object", "json_schema", "structural_tag")


def _response_format(fmt: Any) -> dict[str, Any] | None:
    """`response_format` checked as vLLM's AnyResponseFormat (ResponseFormat |
    StructuralTagResponseFormat) validates it: pydantic errors are 400s."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise SimError("`response_format` must be an object")
    if fmt.get("type") not in _FORMATS:
        raise SimError(
            "`response_format.type` must be one of 'text', 'json_object', 'json_schema', "
            f"'structural_tag', got {fmt.get('type')!r}"
        )
    spec = fmt.get("json_schema")
    if spec is not None and not (isinstance(spec, dict) and isinstance(spec.get("name"), str)):
        raise SimError("`response_format.json_schema` must be an object with a string `name`")
    if fmt["type"] == "structural_tag" and not (
        isinstance(fmt.get("structures"), list) and isinstance(fmt.get("triggers"), list)
    ):
        raise SimError("`response_format` of type 'structural_tag' needs `structures` and "
                       "`triggers` lists")
    return fmt


def _schema_props(schema: Any) -> dict[str, Any]:
    """A JSON schema's (dict or JSON text) `properties`; {} when it names none."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            schema = None
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def json_props(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON output asked for, as both endpoints' to_sampling_params read it:
    `response_format` json_object ({}) or json_schema (its properties), else `guided_json`
    or `structured_outputs` `json` / `json_object`; None for free text."""
    fmt = _response_format(body.get("response_format"))
    if fmt is not None and fmt["type"] == "json_object":
        return {}
    if fmt is not None and fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        return _schema_props(spec.get("schema") if isinstance(spec, dict) else None)
    outputs = body.get("structured_outputs")
    outputs = outputs if isinstance(outputs, dict) else {}
    schema = body.get("guided_json") or outputs.get("json")
    if schema is not None:
        return _schema_props(schema)
    return {} if outputs.get("json_object") else None


def truncated(
    ids: list[int], body: dict[str, Any], settings: SimulatorSettings, limit: int | None,
    bos: bool,
) -> list[int]:
    """`truncate_prompt_tokens`: keep the last N prompt tokens (vLLM tokenizes with
    truncation_side left, so a text prompt keeps its BOS); -1 means max_model_len, and N may
    not pass `limit` (renderer.py _validate_and_normalize_truncate_tokens)."""
    keep = int_field(body, "truncate_prompt_tokens", None)
    if keep is None:
        return ids
    if keep < -1:
        raise SimError("`truncate_prompt_tokens` must be greater than or equal to -1")
    if keep == 0:  # vLLM renders no prompt at all and answers with no choices
        raise SimError("`truncate_prompt_tokens` of 0 leaves no prompt")
    keep = settings.max_model_len if keep == -1 else keep
    if limit is not None and keep > limit:
        raise SimError(
            f"truncate_prompt_tokens ({keep}) cannot be greater than max_length ({limit}). "
            "Please select a smaller truncation size."
        )
    if keep >= len(ids):
        return ids
    return [ids[0], *ids[len(ids) - keep + 1 :]] if bos else ids[-keep:]


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
        include_stop=bool(body.get("include_stop_str_in_output")),
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
