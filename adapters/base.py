"""The two adapter interfaces: a client protocol (Frontend) and a worker protocol (Backend).

Adapters are sans-I/O: bytes and canonical objects in, bytes and canonical objects out. Ids,
`created` and the model name come in a `ResponseMeta`, so encoded bytes are deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from schemas import canonical, errors
from schemas import events as ev

N = TypeVar("N", bound="Note")

# A model's options, as plain data (Target.options), and a model without any.
Options = Mapping[str, Any]
NO_OPTIONS: Options = MappingProxyType({})


# Made per request (RequestContext, ResponseMeta) or per attempt (Target), so not `frozen`: a
# frozen dataclass's __init__ sets each field with `object.__setattr__` (a slot wrapper call,
# some ten times a plain store), which for these three was a few per cent of a whole answer.
# Nothing changes them once made; each holds a mapping, so none was hashable either way.
@dataclass(slots=True)
class RequestContext:
    """What a frontend may read besides the body: path parameters, headers (lower-case), and
    the per-model options of a model name (None: the default model), e.g. `{"lmi": {...}}`;
    `{}` for a name that names no model (gateway.routing.Router.options)."""

    path: str = "/"
    path_params: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    model_options: Callable[[str | None], Mapping[str, Any]] = lambda _: {}


@dataclass(slots=True)
class ResponseMeta:
    """The per-response values that are not a function of the events."""

    id: str
    created: int
    model: str
    request_id: str = ""
    # The serving model's options (its config's `lmi` block, `chat_template`) and the
    # gateway-wide ones (`elastic`), as plain data.
    options: Mapping[str, Any] = field(default_factory=dict)

    def call_id(self, choice: int, index: int, worker_id: str | None = "",
                name: str | None = "f") -> str:
        """A named tool call's id: the worker's, else one made from this response's id, so
        that the client has one to send back as its tool message's `tool_call_id`
        (openai-python's ChatCompletionMessageToolCall `id: str`; trtllm-serve streams a named
        `tool_choice`'s call with none: postprocess_handlers.py chat_stream_post_processor).
        Derived, not random, so that golden bytes stay deterministic and a stream continued on
        another worker keeps the ids it started with. A call with no name (a gap a worker left
        in the indexes) gets none, as in the stream (`delta_call_id`)."""
        return worker_id or (f"call_{self.id}_{choice}_{index}" if name else "")

    def delta_call_id(self, e: ev.ToolCallDelta) -> str | None:
        """The id a streamed fragment carries: the worker's; or, where it gave none, a made
        one on the call's first fragment (the one with its name: decoders give the name
        once), as OpenAI and vLLM send the id on the first fragment only; else None."""
        if e.id:
            return e.id
        return self.call_id(e.choice, e.index) if e.name is not None else None


@dataclass(slots=True)
class Rendered:
    """A whole HTTP answer."""

    status: int
    body: bytes
    media_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def retry_headers(exc: errors.GatewayError) -> dict[str, str]:
    """The error answer's Retry-After, in every client protocol: the gateway's own 429, or the
    one a worker gave with the 429 or 503 passed on (gateway.upstream.with_retry_after)."""
    return {} if exc.retry_after is None else {"retry-after": str(exc.retry_after)}


@dataclass(slots=True)
class Target:
    """Where one attempt goes: an upstream base URL and the model name that worker knows, with
    the model's options (e.g. the `chat_template` a triton worker needs)."""

    base_url: str
    model: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class UpstreamRequest:
    """One HTTP request to a worker, fully built."""

    method: str
    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    streaming: bool = False


@dataclass(slots=True, frozen=True)
class LoadGauges:
    """Where a worker publishes its load, for least-request routing: Prometheus gauges on
    `path`, summed over their label sets. `queued`: requests waiting for a batch slot;
    `cache`: KV-cache usage as a fraction (0..1)."""

    queued: tuple[str, ...]
    cache: tuple[str, ...] = ()
    path: str = "/metrics"


class StreamEncoder(Protocol):
    """Encodes one response's canonical events into a client's wire bytes; holds its state."""

    media_type: str
    headers: Mapping[str, str]  # sent with the stream's status line

    def encode(self, e: ev.Event) -> bytes:
        """Bytes due for this event; b"" when nothing is due yet."""
        ...

    def flush(self) -> bytes:
        """Bytes held back that are due now: called at the end of each upstream read, so an
        encoder that must look ahead (TGI's last event) holds a token no longer than that.
        One that never holds anything says so with a class attribute `holds_back = False`,
        and the relay then skips this call (a few hundred instructions a chunk)."""
        ...

    def fail(self, exc: errors.GatewayError) -> bytes:
        """The in-band error that ends a started stream, terminator included."""
        ...

    def finish(self) -> bytes:
        """What closes a stream that ended well (usage chunk, terminator)."""
        ...


class Translator(Protocol):
    """One request's translation, made by `Frontend.parse` (Envoy AI Gateway's one translator
    per request): the canonical request, and that protocol's typed notes about it (schema,
    framing, what to echo), which its encoder, its whole answer and its errors need."""

    @property
    def request(self) -> canonical.InferenceRequest: ...

    def encoder(self, meta: ResponseMeta) -> StreamEncoder: ...

    def render(self, done: canonical.Completion, meta: ResponseMeta) -> Rendered: ...

    def render_error(self, exc: errors.GatewayError) -> Rendered:
        """An error after the request parsed (no model, worker down), in this request's form."""
        ...


class Note(Exception):
    """What a frontend knew about a request it refused while parsing, chained as the refusal's
    cause (`raise errors.InvalidRequest(...) from note`): `Frontend.render_error(exc)` sees only
    the exception, and errors get no attributes patched on. Each protocol subclasses it with
    its own typed fields (an Elasticsearch exception type, an LMI schema)."""


def note_of(exc: BaseException, kind: type[N]) -> N | None:
    """The note of `kind` an error was raised from, if any."""
    cause = exc.__cause__
    return cause if isinstance(cause, kind) else None


class Frontend(Protocol):
    """A client protocol's route: request bytes -> a Translator. Shared by all the route's
    requests, so it holds no per-request state."""

    def parse(self, body: bytes, ctx: RequestContext) -> Translator: ...

    def render_error(self, exc: errors.GatewayError) -> Rendered:
        """An error before or while parsing (API key, body size, invalid body): every error
        class, with what the exception itself carries."""
        ...


class StreamDecoder(Protocol):
    """Turns a worker's body, fed in any chunking, into canonical events."""

    @property
    def failed(self) -> bool:
        """A failure found in the last read is held back behind the events before it: `feed`
        returned those, and the next `feed` or `close` raises it. Whoever relays a stream asks
        after each read, so a worker that goes quiet after a bad event does not hold the
        client until the idle timeout."""
        ...

    def feed(self, data: bytes) -> list[ev.Event]: ...

    def close(self) -> list[ev.Event]:
        """Events still due at the end; raises UpstreamBroken if the answer was unfinished."""
        ...


class Backend(Protocol):
    """A worker protocol: canonical -> its request; its body -> canonical events."""

    def check(self, req: canonical.InferenceRequest) -> None:
        """Raise Unsupported, before any I/O, for what this worker cannot do."""
        ...

    def build(self, req: canonical.InferenceRequest, target: Target) -> UpstreamRequest: ...

    def decoder(self, req: canonical.InferenceRequest, streaming: bool) -> StreamDecoder: ...

    def parse_error(self, status: int, body: bytes) -> errors.GatewayError: ...

    def token_limit(self, req: canonical.InferenceRequest) -> int | None:
        """The most tokens the worker generates for one sequence of `req`: the client's limit,
        else the worker protocol's default; None when only the context bounds it. How long a
        whole answer asked as one body may take follows from it (gateway.whole)."""
        ...

    def streams_whole(self, req: canonical.InferenceRequest) -> bool:
        """Whether a whole answer to `req` may be asked of the worker as a stream (`req` with
        `stream` set) and folded: False where only the worker's non-streaming answer carries
        what the answer needs, or where `build` already chooses for itself."""
        ...

    def tokens_whole(self, req: canonical.InferenceRequest) -> bool:
        """Whether the worker's one-body answer to `req` shows each generated token (its id or
        its logprob), as a client format that carries one entry per token needs (`per_token`:
        TGI and LMI details). Where it does not, such an answer is asked as a stream and
        folded, one token per chunk as the streamed answer gives them (gateway.whole)."""
        ...

    def health_path(self) -> str: ...

    def load_gauges(self) -> LoadGauges | None:
        """The worker's queue gauges, or None when it publishes none."""
        ...

    def continuation(self, req: canonical.InferenceRequest, text_so_far: str,
                     tokens_so_far: int, options: Mapping[str, Any] = NO_OPTIONS
                     ) -> canonical.InferenceRequest | None:
        """A request asking a worker to go on with an answer cut after `text_so_far` (the
        text every client has already seen), or None when this worker cannot continue it.
        `options`: the model's (Target.options), e.g. the `chat_template` a chat is rendered
        with where the worker's chat route cannot continue a turn."""
        ...

    def continues(self, req: canonical.InferenceRequest,
                  options: Mapping[str, Any] = NO_OPTIONS) -> bool:
        """Whether `continuation` gives a request for `req`, without making one: asked of
        every stream, to know whether its progress need be tracked. Where the continuation
        renders the chat with the model's template it may still find, rendering, that it
        cannot (a template that fails, an opening the worker would double)."""
        ...


@dataclass(slots=True, frozen=True)
class WorkerKind:
    """A kind of managed worker: its command line, with `{python}` (this interpreter),
    `{model}` (the upstream model name), `{host}` and `{port}` filled in when started; the
    worker protocol it speaks; and whether it starts fast enough that serving waits for it."""

    command: tuple[str, ...]
    protocol: str
    starts_fast: bool = False
    # `{model}` may be a local model directory, whose tokenizer.json is then the model's
    # tokenizer unless `models[].tokenizer` names one (gateway/tokenizer.py).
    model_dir: bool = False

    def argv(self, *, python: str, model: str, host: str, port: int) -> list[str]:
        values = {"python": python, "model": model, "host": host, "port": str(port)}
        return [part.format_map(values) for part in self.command]


@dataclass(slots=True, frozen=True)
class ModelView:
    """What status routes may say about one model."""

    name: str
    aliases: tuple[str, ...]
    upstream_model: str
    healthy: bool  # at least one upstream is in rotation (not ejected, probe passing)
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class GatewayView:
    """A snapshot of the gateway for status routes (/health, /ping, /info, /v1/models)."""

    models: tuple[ModelView, ...]
    default: ModelView | None
    version: str
    started: int
    max_concurrent_requests: int
    max_request_bytes: int


# A status route: GET-style, no body, answered from a snapshot.
StatusRoute = Callable[[GatewayView, RequestContext], Rendered]


@dataclass(slots=True, frozen=True)
class InferenceRoute:
    """A client protocol's inference route (POST): its path in Starlette syntax and the
    frontend class that serves every request of it."""

    path: str
    frontend: type[Frontend]


@dataclass(slots=True, frozen=True)
class StatusRouteSpec:
    """A client protocol's status route (GET): its answer from a snapshot, the frontend whose
    error body its refusals take, and whether it stays open when API keys are set (the health
    checks orchestrators call without a key). `claims`: on a path another protocol's route
    holds, the requests this one answers instead, told by their headers (the other route
    keeps its errors and openness)."""

    path: str
    answer: StatusRoute
    errors: type[Frontend]
    open: bool = False
    claims: Callable[[Mapping[str, str]], bool] | None = None
