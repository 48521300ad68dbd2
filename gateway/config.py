"""The YAML configuration: frozen pydantic models, a default for every key, unknown keys refused.

`load_config(path, environ)` merges `GATEWAY_SERVER__PORT=9000`-style variables into the raw
mapping before validation, so every error names its location (`models[1].upstreams[0]`).
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from adapters import registry
from gateway import cors_settings, overrides, references

ENV_PREFIX = overrides.PREFIX
CorsConfig = cors_settings.CorsConfig


def _base_url(url: str) -> str:
    """An upstream base URL: http(s), a host, a port in 1-65535 when one is given. Errors show
    it with its password masked (gateway.upstream.shown)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{_shown(url)!r} must start with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"{_shown(url)!r} names no host")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 or (port is None and parts.netloc.endswith(":")):
        raise ValueError(f"{_shown(url)!r}: the port must be a number in 1-65535")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        # the worker's route is appended to the base URL: `?x=1` would end up before it
        raise ValueError(f"{_shown(url)!r}: a base URL takes no query or fragment")
    url = url.rstrip("/")
    # The worker's routes carry their API version (`/v1/chat/completions`, `/v1/models`,
    # TGI's `/generate` beside its `/v1/chat/completions`), appended to the base URL; the
    # OpenAI convention (vLLM's and TGI's docs, the openai SDK's `base_url`) writes the base
    # with `/v1`, which would give `/v1/v1/...`: 404 on every request and health probe.
    return url.removesuffix("/v1") if parts.path.rstrip("/").endswith("/v1") else url


def _shown(url: str) -> str:
    from gateway import upstream  # the HTTP clients' module: imported only for an error

    return upstream.shown(url)


BaseUrl = Annotated[str, AfterValidator(_base_url)]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any, info: ValidationInfo) -> Any:
        """A YAML boolean (`true`, `yes`, `on`) where a number belongs is a mistake that
        pydantic's lax mode would take as 1 or 0 (`max_concurrent_requests: yes`: one
        request at a time)."""
        if isinstance(value, bool) and info.field_name is not None:
            kind = cls.model_fields[info.field_name].annotation
            if kind in (int, float) or (isinstance(kind, str) and kind in ("int", "float")):
                raise ValueError(f"a number is required, not the YAML boolean {str(value).lower()}")
        return value


class Timeouts(_Frozen):
    connect: float = Field(5, gt=0)
    first_byte: float = Field(120, gt=0)
    idle: float = Field(60, gt=0)
    request_read: float = Field(30, gt=0)
    # An idle client connection is closed after this. Above the 60 s that an AWS ALB and
    # ingress-nginx keep idle connections to their targets, so that the proxy closes first and
    # never sends a request on a connection the gateway is closing (a 502 at the proxy).
    keep_alive: float = Field(75, gt=0)


class HealthConfig(_Frozen):
    """Passive ejection and active probing of upstreams (SPEC.md, Routing, health and failover)."""

    eject_after: int = Field(3, ge=1)  # consecutive failures that eject an upstream
    backoff: float = Field(1.0, gt=0)  # first ejection; doubles after each failed trial
    backoff_max: float = Field(30, gt=0)
    probe_interval: float = Field(5, gt=0)  # health route of static and DNS-expanded upstreams
    probe_timeout: float = Field(2, gt=0)
    load_interval: float = Field(1, gt=0)  # workers' /metrics queue gauges (least_request)


class ServerConfig(_Frozen):
    host: str = "0.0.0.0"
    port: int = Field(8080, ge=0, le=65535)
    api_keys: tuple[str, ...] = ()
    max_request_bytes: int = Field(10 * 1024 * 1024, gt=0)
    max_concurrent_requests: int = Field(1024, gt=0)
    timeouts: Timeouts = Timeouts()
    retries: int = Field(2, ge=0, le=10)  # further attempts before the first byte
    drain_seconds: float = Field(30, ge=0)  # SIGTERM: time given to in-flight streams
    failover_attempts: int = Field(1, ge=0, le=10)  # continuations of a stream cut mid-way
    health: HealthConfig = HealthConfig()
    # serving processes on the one port; "auto": one per CPU this process may use (its
    # affinity mask, capped by its cgroup's CPU quota: gateway.processes.count)
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    # OpenTelemetry spans (the `otel` extra): auto = when OTEL_TRACES_EXPORTER or an
    # OTEL_EXPORTER_OTLP_*ENDPOINT variable asks for an exporter (gateway/tracing.py).
    tracing: Literal["auto", "on", "off"] = "auto"
    cors: cors_settings.CorsConfig = cors_settings.CorsConfig()  # browsers (gateway/cors.py)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> Any:
        """One message naming what is taken, not pydantic's one per member of the union."""
        if value == "auto" or (type(value) is int and value >= 1):
            return value
        raise PydanticCustomError("workers", "must be a whole number of at least 1, or auto")

    @field_validator("tracing", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        """YAML 1.1 (PyYAML) reads a bare `on` / `off` as a boolean: the words meant."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        """Keys a client can send: none empty (an empty key would let in a request that sends
        none, a missing header reading as ""), none with a blank at either end (not part of a
        header's value, RFC 9110 section 5.5)."""
        for i, key in enumerate(keys):
            if not key or key != key.strip():
                raise ValueError(f"[{i}] must be non-empty, without leading or trailing blanks")
        return keys


def _one_of(value: str, names: Mapping[str, object]) -> str:
    """A name the registry knows, refused in the words pydantic uses for a Literal."""
    if value not in names:
        *rest, last = (repr(n) for n in names)
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": f"{', '.join(rest)} or {last}"})
    return value


class ModelFields(_Frozen):
    """A model's own settings; the protocols' per-model options (registry.MODEL_OPTIONS) are
    added to these in `ModelConfig`."""

    name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    backend: str = registry.DEFAULT_BACKEND  # a worker protocol (registry.BACKENDS)
    upstreams: tuple[BaseUrl, ...] = ()
    upstream_model: str | None = None
    routing: Literal["least_request", "round_robin", "prefix"] = "least_request"
    chat_template: str | None = None
    # A Hugging Face tokenizer.json, or a model directory holding one: token ids for clients
    # whose format carries them when the worker gives none (gateway/tokenizer.py).
    tokenizer: str | None = None

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        return _one_of(v, registry.BACKENDS)

    @field_validator("upstreams")
    @classmethod
    def _distinct(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        """Each worker once: one listed twice would be one health record under two balancer
        slots. Taken as listed once (a config that repeats a worker to weight it, as nginx's
        upstream block allows, still starts; the balancer weighs by load instead)."""
        return tuple(dict.fromkeys(urls))

    def protocol_options(self) -> dict[str, BaseModel]:
        """The protocols' options sections of this model, by key."""
        return {key: getattr(self, key) for key in registry.MODEL_OPTIONS}


class WorkerConfig(_Frozen):
    kind: str  # a managed worker kind (registry.WORKER_KINDS)
    model: str
    port: int = Field(0, ge=0, le=65535)  # 0: a free loopback port
    host: str = "127.0.0.1"
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    gpus: str | None = None
    # Seconds to a first healthy /health before the worker is killed and started again. vLLM
    # listens only once its weights are loaded (its socket is bound, not listening, before:
    # vllm/entrypoints/openai/api_server.py setup_server), which takes 5 to 15 minutes for a
    # large model and more on a first download: a 10-minute default killed such a worker as
    # it loaded, and every restart began the load again. 30 minutes, as the manifests'
    # startup probes (deploy/k8s).
    startup_timeout: float = Field(1800, gt=0)
    # Seconds a worker that was healthy stays out of rotation for failing its health probe
    # before it is stopped (SIGTERM, then SIGKILL) and started again by `restart`: a worker
    # whose process runs but no longer answers is otherwise never restarted (a pod's liveness
    # probe would restart it). Minutes, so that a worker too busy to answer its probe in time,
    # which takes no new requests while out of rotation, gets back first. 0: never.
    unhealthy_timeout: float = Field(300, ge=0)
    restart: Literal["always", "on-failure", "never"] = "always"

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        return _one_of(v, registry.WORKER_KINDS)

    @field_validator("args", "env", "gpus", mode="before")
    @classmethod
    def _text(cls, value: Any, info: ValidationInfo) -> Any:
        """A command line, an environment and CUDA_VISIBLE_DEVICES are text: YAML reads
        `[--tokens, 8]`, `{OMP_NUM_THREADS: 4}` and `gpus: [0, 1]` as numbers, meant as written
        (a boolean stays an error: `yes` may mean "yes" or "true")."""
        def word(v: Any) -> Any:
            return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
        if isinstance(value, dict):
            return {k: word(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            words = [word(v) for v in value]
            return ",".join(map(str, words)) if info.field_name == "gpus" else words
        return word(value)


class ConfigFields(_Frozen):
    """The gateway's own settings; the protocols' gateway-wide options
    (registry.GATEWAY_OPTIONS) are added to these in `Config`."""

    server: ServerConfig = ServerConfig()
    default_model: str | None = None
    models: tuple[ModelFields, ...] = ()
    workers: tuple[WorkerConfig, ...] = ()

    def protocol_options(self) -> dict[str, BaseModel]:
        """The protocols' gateway-wide options sections, by key."""
        return {key: getattr(self, key) for key in registry.GATEWAY_OPTIONS}

    @model_validator(mode="before")
    @classmethod
    def _worker_models(cls, raw: Any) -> Any:
        """A model that only `workers[].model` names is declared by its workers, speaking
        their kind's protocol: SPEC.md's sample config names `demo` only there (and as
        `default_model`), as the embedded default serves it."""
        implied = references.worker_models(raw)
        if implied and isinstance(models := raw.get("models") or [], list | tuple):
            raw = {**raw, "models": [*models, *implied]}
        return raw

    @model_validator(mode="after")
    def _references(self) -> ConfigFields:
        if problems := references.problems(self.model_dump()):
            raise PydanticCustomError("references", "\n".join(problems))
        return self


def _with_options(name: str, base: type[_Frozen], options: Mapping[str, type[BaseModel]],
                  **fields: Any) -> Any:
    """`base` with one field per protocol options section, each defaulting to its defaults;
    named as the module attribute it is bound to, so that its instances pickle."""
    sections: dict[str, Any] = {key: (model, model()) for key, model in options.items()}
    return create_model(name, __base__=base, __module__=__name__, **sections, **fields)


if TYPE_CHECKING:
    ModelConfig = ModelFields
    Config = ConfigFields
else:
    ModelConfig = _with_options("ModelConfig", ModelFields, registry.MODEL_OPTIONS)
    Config = _with_options("Config", ConfigFields, registry.GATEWAY_OPTIONS,
                           models=(tuple[ModelConfig, ...], ()))


def warnings_of(cfg: Config) -> list[str]:
    """What is valid but likely a mistake: a model nothing can serve."""
    served = {w.model for w in cfg.workers}
    return [f"models[{i}]: model {m.name!r} has no upstreams and no worker; its requests "
            f"will fail with 503" for i, m in enumerate(cfg.models)
            if not m.upstreams and m.name not in served]


class ConfigError(Exception):
    """Every problem found, each with its location."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def default_config() -> Config:
    """The embedded default (registry.DEFAULT_CONFIG)."""
    return Config.model_validate(registry.DEFAULT_CONFIG)


def load_config(path: str | Path | None, environ: Mapping[str, str],
                warnings: list[str] | None = None) -> Config:
    """Read, merge environment overrides, validate; raise ConfigError listing every problem.

    Problems and warnings name locations, never the file (the caller prefixes it once).
    Warnings (stray `GATEWAY_*` variables, models nothing serves) go to `warnings` when
    given, else to the log."""
    raw = read_file(path) if path is not None else default_config().model_dump(mode="json")
    env = apply_env(raw, environ)
    found = env.warnings + [
        f"workers: model {m['name']!r} is not in `models`; it is served as a model of its own "
        f"(backend {m['backend']})" for m in references.worker_models(raw)]
    try:
        cfg = Config.model_validate(raw)
        found += warnings_of(cfg)
    except ValidationError as exc:
        problems = [_problem(e, env) for e in exc.errors() if e["type"] != "references"]
        raise ConfigError(problems + references.problems(raw)) from None
    finally:
        if warnings is not None:
            warnings.extend(found)
        for text in found if warnings is None else ():
            logging.getLogger("gateway.config").warning(text)
    return cfg


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error (YAML 1.2
    section 3.2.1.1: keys are unique); PyYAML keeps the last one silently, so a second
    `server:` section would drop the first without a word. Merge keys (`<<`) may still be
    overridden, as YAML's merge type allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


def read_file(path: str | Path) -> dict[str, Any]:
    """The file's top-level mapping; YAML errors carry their line and column (PyYAML's mark
    names the stream, `<unicode string>` for text, so the mark is rendered here)."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.load(f, Loader=_UniqueKeys) or {}  # a SafeLoader
    except OSError as exc:
        raise ConfigError([exc.strerror or str(exc)]) from None
    except UnicodeDecodeError:
        raise ConfigError(["not UTF-8 text"]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError([f"{where}not valid YAML: {exc.problem or exc.context}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {exc}"]) from None
    if not isinstance(raw, dict):
        raise ConfigError(["the top level must be a mapping"])
    return raw


def apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> overrides.Applied:
    """`GATEWAY_SERVER__PORT=9000` sets raw["server"]["port"] (gateway/overrides.py)."""
    return overrides.apply(raw, environ, Config)


def _problem(err: Any, env: overrides.Applied) -> str:
    loc = ""
    for part in err.get("loc", ()):
        loc += f"[{part}]" if isinstance(part, int) else (("." if loc else "") + str(part))
    msg = err.get("msg", "invalid")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key"
    msg = msg.removeprefix("Value error, ")
    source = env.source(tuple(err.get("loc", ())))
    if source and isinstance(err.get("input"), str) and not err["input"].strip(" ,"):
        # an empty variable (a Secret that lost its key) is no value, never the default
        msg = "the variable is empty: give a value, or unset it for the default"
    text = f"{loc or '(top level)'}: {msg}"
    return f"{text} (set by {source})" if source else text
