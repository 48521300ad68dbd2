"""TGI client protocol: POST /generate, /generate_stream and / to canonical; GET /info, /health.

Teams leaving TGI change only their base URL, so requests are checked as TGI's router checks
them (validation.rs, with its messages) and mapped onto the worker: the raw `inputs` go to the
worker's completion endpoint (TGI applies no chat template there). Sources: TGI router
`lib.rs`, `server.rs`, `validation.rs` @ db931fcf (v3.3.7); wire-formats.md sections 4 and 8.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from adapters import base
from adapters.frontends import tgi_encode as enc
from adapters.frontends import tgi_extract
from schemas import canonical, errors
from schemas import tgi as wire

Mode = Literal["generate", "stream", "compat"]

# TGI launcher defaults (launcher/src/main.rs): what /info reports and validation enforces.
MAX_BEST_OF = 2
MAX_STOP_SEQUENCES = 4
MAX_TOP_N_TOKENS = 5
MAX_CLIENT_BATCH_SIZE = 4
VALIDATION_WORKERS = 2
# The gateway does not know the worker's context length; these are TGI's fallbacks when the
# model config gives none (max_total_tokens 4096, max_input_tokens = max_total_tokens - 1).
MAX_TOTAL_TOKENS = 4096
MAX_INPUT_TOKENS = MAX_TOTAL_TOKENS - 1
# The TGI release whose API this front end reproduces, as /info `version` and the chat
# `system_fingerprint` ("{version}-{docker_label or 'native'}", server.rs chat_completions).
TGI_VERSION = "3.3.7"
SYSTEM_FINGERPRINT: str = f"{TGI_VERSION}-native"


@dataclass(slots=True)
class TgiTranslator:
    """One TGI generate request: the canonical request and what its answer must show."""

    request: canonical.InferenceRequest
    state: enc.TgiState
    in_stream: bool = False  # a stream (/generate_stream, POST / with `stream`): every error
    # is an event after HTTP 200

    def encoder(self, meta: base.ResponseMeta) -> base.StreamEncoder:
        return enc.StreamEncoder(self.state, enc.special_ids(meta))

    def render(self, done: canonical.Completion, meta: base.ResponseMeta) -> base.Rendered:
        return enc.render(self.state, done, enc.special_ids(meta))

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        return enc.render_error(exc, in_stream=self.in_stream)


# The note on an error of TGI's checks of a streaming request: they run inside the stream
# (server.rs generate_stream_internal), so it is answered with HTTP 200 and an error event.
# A note, not a subclass: the error tree is the same for every protocol.
IN_STREAM = "TGI refuses a streaming request inside its stream (HTTP 200, an error event)"


class TgiFrontend:
    """One TGI generate route; `mode` says which, so that errors take that route's form."""

    def __init__(self, mode: Mode = "generate"):
        self.mode: Final[Mode] = mode

    def parse(self, body: bytes, ctx: base.RequestContext) -> TgiTranslator:
        # axum's Json extractor refuses a malformed body before the handler, and so before
        # any stream (tgi_extract); the handler's checks of a streaming request are in it.
        raw: wire.GenerateRequest
        if self.mode == "compat":
            compat = tgi_extract.extract(body, ctx.headers, wire.CompatGenerateRequest)
            raw, stream = compat, bool(compat.stream)
        else:
            raw = tgi_extract.extract(body, ctx.headers, wire.GenerateRequest)
            stream = self.mode == "stream"
        try:
            req, st = to_canonical(raw, stream, self.mode == "compat")
        except errors.InvalidRequest as exc:
            if stream:
                exc.add_note(IN_STREAM)
            raise
        return TgiTranslator(req, st, in_stream=stream)

    def render_error(self, exc: errors.GatewayError) -> base.Rendered:
        """/generate_stream answers every error of its handler after HTTP 200 as an event
        (server.rs); so does POST / with `"stream": true`, as compat_generate hands the request
        to generate_stream (IN_STREAM says so here, the translator after parsing)."""
        in_stream = self.mode == "stream" or IN_STREAM in getattr(exc, "__notes__", ())
        return enc.render_error(exc, in_stream=in_stream)


class TgiGenerateFrontend(TgiFrontend):
    """POST /generate."""

    def __init__(self) -> None:
        super().__init__("generate")


class TgiStreamFrontend(TgiFrontend):
    """POST /generate_stream."""

    def __init__(self) -> None:
        super().__init__("stream")


class TgiCompatFrontend(TgiFrontend):
    """POST / (compat_generate: the body's `stream` flag picks the answer)."""

    def __init__(self) -> None:
        super().__init__("compat")


def to_canonical(raw: wire.GenerateRequest, stream: bool,
                 compat: bool) -> tuple[canonical.InferenceRequest, enc.TgiState]:
    """A checked TGI request in canonical form, and what its answer must show."""
    absent = raw.parameters is None
    p = raw.parameters or wire.GenerateParameters()
    best_of = p.best_of if p.best_of is not None else 1
    if stream:  # server.rs generate_stream_internal checks these first
        if best_of != 1:
            raise _invalid("`best_of` != 1 is not supported when streaming tokens", "best_of")
        if p.decoder_input_details:
            raise _invalid("`decoder_input_details` == true is not supported when streaming "
                           "tokens", "decoder_input_details")
    # lib.rs default_parameters(): no `parameters` at all means do_sample = true.
    do_sample = True if absent else bool(p.do_sample)
    check(raw.inputs, p, do_sample, best_of)
    sampling = _sampling(p, do_sample, best_of)
    details = bool(p.details or (p.decoder_input_details and not stream))
    # Every streamed token carries its id and logprob (StreamResponse.token), and so do the
    # details' tokens: the worker's, else the tokenizer's ids and null logprobs (`per_token`,
    # never refused). What the client asks for by name is required: the top tokens, and the
    # logprobs best_of picks by (mean logprob, infer/mod.rs generate_best_of).
    full_text = p.return_full_text if p.return_full_text is not None else compat
    # validation.rs: a request without a seed gets a random one; the shard reports it when it
    # samples (flash_causal_lm.py: `seed if do_sample else None`). Each sequence of best_of
    # is a request of its own, with its own seed (infer/mod.rs generate_best_of).
    if sampling.seed is None and best_of == 1 and _sampling_on(p, do_sample):
        sampling.seed = draw_seed()
    req = canonical.InferenceRequest(
        model=p.adapter_id,  # a LoRA adapter is a model name to vLLM
        prompts=[raw.inputs], sampling=sampling, stream=stream,
        logprobs=best_of > 1 or bool(p.top_n_tokens), top_logprobs=p.top_n_tokens or 0,
        per_token=stream or details or best_of > 1,
        prompt_logprobs=1 if p.decoder_input_details else None)
    st = enc.TgiState(
        details=details, prefill=bool(p.decoder_input_details),
        top_n_tokens=p.top_n_tokens or 0,
        best_of=best_of, seed=sampling.seed if _sampling_on(p, do_sample) else None,
        # compat_generate: return_full_text defaults to true for a `text-generation`
        # pipeline tag, which /info reports (server.rs, `compat_return_full_text`).
        prefix=raw.inputs if full_text else "", wrap=compat and not stream)
    _extras(req, p)
    return req, st


def draw_seed() -> int:
    """A random seed, as validation.rs draws a u64 (`thread_rng().gen()`), of 63 bits: vLLM
    takes seeds up to 2**63 - 1 only (its protocol.py: `le=_LONG_INFO.max`)."""
    return random.getrandbits(63)


def _invalid(message: str, field: str) -> errors.InvalidRequest:
    return errors.InvalidRequest(message, field=field)


def _sampling_on(p: wire.GenerateParameters, do_sample: bool) -> bool:
    """The model server samples when asked to or when any warper is active (server
    utils/tokens.py NextTokenChooser: `sampling = do_sample or has_warpers`)."""
    return (do_sample or (p.temperature is not None and p.temperature != 1.0)
            or bool(p.top_k) or (p.top_p is not None and p.top_p < 1.0)
            or (p.typical_p is not None and p.typical_p < 1.0))


def _sampling(p: wire.GenerateParameters, do_sample: bool, best_of: int) -> canonical.Sampling:
    """TGI parameters onto canonical ones; greedy decoding is temperature 0 to the worker."""
    greedy = not _sampling_on(p, do_sample)
    return canonical.Sampling(
        max_tokens=p.max_new_tokens,
        temperature=0.0 if greedy else p.temperature,
        top_p=p.top_p, top_k=p.top_k, typical_p=p.typical_p,
        repetition_penalty=p.repetition_penalty, frequency_penalty=p.frequency_penalty,
        seed=p.seed, stop=list(p.stop or []), truncate=p.truncate,
        watermark=True if p.watermark else None,  # refused by workers that cannot watermark
        n=best_of if best_of > 1 else 1)


def _extras(req: canonical.InferenceRequest, p: wire.GenerateParameters) -> None:
    """What has no canonical field, for the worker to take as is (vLLM extras)."""
    # TGI's default is as many tokens as fit (validation.rs validate_input), and it keeps the
    # matched stop sequence in the text (StopSequenceCriteria); each worker says so its way.
    req.sampling.max_tokens_fit = p.max_new_tokens is None
    req.sampling.keep_stop = bool(p.stop)
    if p.grammar is not None:
        _grammar(req, p.grammar)


def _grammar(req: canonical.InferenceRequest, g: wire.Grammar) -> None:
    """`grammar` (GrammarType) as a JSON-schema response_format, or vLLM's regex structured
    output."""
    if g.type == "regex":
        req.extra["structured_outputs"] = {"regex": g.value}
        return
    schema = g.value.get("schema") if g.type == "json_schema" else g.value
    name = g.value.get("name") if g.type == "json_schema" else None
    req.response_format = {"type": "json_schema",
                           "json_schema": {"name": name or "grammar", "schema": schema}}


def check(inputs: str, p: wire.GenerateParameters, do_sample: bool, best_of: int) -> None:
    """validation.rs `Validation::validate`, in its order and with its messages; the count of
    best_of first, as infer/mod.rs generate_best_of checks it before `validate` runs."""
    if best_of > MAX_BEST_OF:  # validate_best_of
        raise _invalid(f"`best_of` must be > 0 and <= {MAX_BEST_OF}. Given: {best_of}",
                       "best_of")
    sampling = (do_sample or p.temperature is not None or p.top_k is not None
                or p.top_p is not None or p.typical_p is not None)
    if best_of > 1 and not sampling:
        raise _invalid("you must use sampling when `best_of` is > 1", "best_of")
    _ranges(p)
    if p.stop is not None and len(p.stop) > MAX_STOP_SEQUENCES:
        raise _invalid(f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. "
                       f"Given: {len(p.stop)}", "stop")
    if p.seed is not None and best_of > 1:
        raise _invalid("`seed` must not be set when `best_of` > 1", "seed")
    if p.top_n_tokens is not None and p.top_n_tokens > MAX_TOP_N_TOKENS:
        raise _invalid(f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}. "
                       f"Given: {p.top_n_tokens}", "top_n_tokens")
    if not inputs:
        raise _invalid("`inputs` cannot be empty", "inputs")
    if p.truncate is not None and not 0 < p.truncate <= MAX_INPUT_TOKENS:
        raise _invalid(f"`truncate` must be strictly positive and less than "
                       f"{MAX_INPUT_TOKENS}. Given: {p.truncate}", "truncate")
    if p.grammar is not None:
        p.grammar.value = _check_grammar(p.grammar)


# (field, is it out of range, TGI's message) in validation.rs order.
_RANGES: list[tuple[str, Any, str]] = [
    ("temperature", lambda v: v <= 0, "`temperature` must be strictly positive"),
    ("repetition_penalty", lambda v: v <= 0, "`repetition_penalty` must be strictly positive"),
    ("frequency_penalty", lambda v: not -2.0 <= v <= 2.0,
     "`frequency_penalty` must be >= -2.0 and <= 2.0"),
    ("top_p", lambda v: not 0.0 < v < 1.0, "`top_p` must be > 0.0 and < 1.0"),
    ("typical_p", lambda v: not 0.0 < v < 1.0, "`typical_p` must be > 0.0 and < 1.0"),
    ("top_k", lambda v: v <= 0, "`top_k` must be strictly positive"),
    ("max_new_tokens", lambda v: v == 0, "`max_new_tokens` must be strictly positive"),
]


def _ranges(p: wire.GenerateParameters) -> None:
    for name, bad, message in _RANGES:
        value = getattr(p, name)
        if value is not None and bad(value):
            raise _invalid(message, name)


def _check_grammar(g: wire.Grammar) -> Any:
    """validation.rs grammar checks: JSON given as an object or as JSON text, with `properties`."""
    if g.type == "regex":
        if not isinstance(g.value, str):
            raise _invalid("grammar is not supported", "grammar")
        return g.value
    value = g.value
    if g.type != "json_schema" and isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise _invalid(f"grammar is not valid: {exc}", "grammar") from None
    schema = value.get("schema") if g.type == "json_schema" and isinstance(value, dict) else value
    if not isinstance(schema, dict):
        raise _invalid("grammar is not supported", "grammar")
    if "properties" not in schema:
        raise _invalid("grammar is not valid: Grammar must have a 'properties' field", "grammar")
    return value


# ---- status routes ----


def info(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET /info: lib.rs `Info`, in its field order; the model is the default model's upstream
    name (TGI reports the Hub id it loaded), the limits those this front end enforces."""
    body = {
        "model_id": view.default.upstream_model if view.default is not None else "",
        "model_sha": None, "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": view.max_concurrent_requests,
        "max_best_of": MAX_BEST_OF, "max_stop_sequences": MAX_STOP_SEQUENCES,
        "max_input_tokens": MAX_INPUT_TOKENS, "max_total_tokens": MAX_TOTAL_TOKENS,
        "validation_workers": VALIDATION_WORKERS, "max_client_batch_size": MAX_CLIENT_BATCH_SIZE,
        "router": "text-generation-router", "version": TGI_VERSION, "sha": None,
        "docker_label": None,
    }
    return base.Rendered(200, orjson.dumps(body))


def health(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET /health (and TGI's GET /): 200 with an empty body and no content-type (server.rs
    `health` answers `()`), or 503 with TGI's ErrorResponse when the default model has no
    healthy worker."""
    if view.default is not None and view.default.healthy:
        return base.Rendered(200, b"", media_type="")
    return base.Rendered(503, b'{"error":"unhealthy","error_type":"healthcheck"}')


# One frontend per route, so that errors take that route's form (TgiFrontend).
ROUTES = (
    base.InferenceRoute("/generate", TgiGenerateFrontend),
    base.InferenceRoute("/generate_stream", TgiStreamFrontend),
    base.InferenceRoute("/", TgiCompatFrontend),
)
STATUS_ROUTES = (
    base.StatusRouteSpec("/health", health, TgiFrontend, open=True),  # 200 empty / 503
    base.StatusRouteSpec("/", health, TgiFrontend),  # TGI answers GET / as /health
    base.StatusRouteSpec("/info", info, TgiFrontend),
)
