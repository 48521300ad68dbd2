"""The YAML configuration: frozen pydantic models, a default for every key, unknown keys refused.

`load_config(path, environ)` merges `GATEWAY_SERVER__PORT=9000`-style variables into the raw
mapping before validation, so every error names its location (`models[1].upstreams[0]`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from adapters import registry

ENV_PREFIX = "GATEWAY_"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Frozen):
    connect: float = Field(5, gt=0)
    first_byte: float = Field(120, gt=0)
    idle: float = Field(60, gt=0)
    request_read: float = Field(30, gt=0)


class ServerConfig(_Frozen):
    host: str = "0.0.0.0"
    port: int = Field(8080, ge=0, le=65535)
    api_keys: tuple[str, ...] = ()
    max_request_bytes: int = Field(10 * 1024 * 1024, gt=0)
    max_concurrent_requests: int = Field(1024, gt=0)
    timeouts: Timeouts = Timeouts()
    retries: int = Field(2, ge=0, le=10)  # further attempts before the first byte
    drain_seconds: float = Field(30, ge=0)  # SIGTERM: time given to in-flight streams
    # serving processes on the one port; "auto": one per CPU this process may run on
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = 1


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
    upstreams: tuple[str, ...] = ()
    upstream_model: str | None = None
    chat_template: str | None = None

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        return _one_of(v, registry.BACKENDS)

    def protocol_options(self) -> dict[str, BaseModel]:
        """The protocols' options sections of this model, by key."""
        return {key: getattr(self, key) for key in registry.MODEL_OPTIONS}

    @field_validator("upstreams")
    @classmethod
    def _urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for url in v:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {url!r} must start with http:// or https://")
        return tuple(u.rstrip("/") for u in v)


class WorkerConfig(_Frozen):
    kind: str  # a managed worker kind (registry.WORKER_KINDS)
    model: str
    port: int = Field(0, ge=0, le=65535)  # 0: a free loopback port
    host: str = "127.0.0.1"
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    gpus: str | None = None
    startup_timeout: float = Field(600, gt=0)
    restart: Literal["always", "on-failure", "never"] = "always"

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        return _one_of(v, registry.WORKER_KINDS)


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

    @model_validator(mode="after")
    def _references(self) -> ConfigFields:
        names: dict[str, int] = {}
        for i, m in enumerate(self.models):
            for name in (m.name, *m.aliases):
                if name in names:
                    raise ValueError(f"models[{i}]: name {name!r} is already used by "
                                     f"models[{names[name]}]")
                names[name] = i
        if self.default_model is not None and self.default_model not in names:
            raise ValueError(f"default_model: {self.default_model!r} is not a model name")
        for i, w in enumerate(self.workers):
            if w.model not in names:
                raise ValueError(f"workers[{i}].model: {w.model!r} is not a model name")
        return self


def _with_options(base: type[_Frozen], options: Mapping[str, type[BaseModel]],
                  **fields: Any) -> Any:
    """`base` with one field per protocol options section, each defaulting to its defaults."""
    sections: dict[str, Any] = {key: (model, model()) for key, model in options.items()}
    return create_model(base.__name__.replace("Fields", "Config"), __base__=base,
                        __module__=__name__, **sections, **fields)


if TYPE_CHECKING:
    ModelConfig = ModelFields
    Config = ConfigFields
else:
    ModelConfig = _with_options(ModelFields, registry.MODEL_OPTIONS)
    Config = _with_options(ConfigFields, registry.GATEWAY_OPTIONS,
                           models=(tuple[ModelConfig, ...], ()))


class ConfigError(Exception):
    """Every problem found, each with its location."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def default_config() -> Config:
    """The embedded default (registry.DEFAULT_CONFIG)."""
    return Config.model_validate(registry.DEFAULT_CONFIG)


def load_config(path: str | Path | None, environ: Mapping[str, str]) -> Config:
    """Read, merge environment overrides, validate; raise ConfigError listing every problem."""
    raw: Any = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError([f"{path}: {exc.strerror}"]) from None
        except yaml.YAMLError as exc:
            raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
        if not isinstance(raw, dict):
            raise ConfigError([f"{path}: the top level must be a mapping"])
    else:
        raw = default_config().model_dump(mode="json")
    raw = apply_env(raw, environ)
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError([_problem(e) for e in exc.errors()]) from None


def apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """`GATEWAY_SERVER__PORT=9000` sets raw["server"]["port"]; values are parsed as YAML."""
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX):].split("__")]
        if not all(path):
            continue
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[path[-1]] = yaml.safe_load(value) if value else value
    return raw


def _problem(err: Any) -> str:
    loc = ""
    for part in err.get("loc", ()):
        loc += f"[{part}]" if isinstance(part, int) else (("." if loc else "") + str(part))
    msg = err.get("msg", "invalid")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key"
    return f"{loc or '(top level)'}: {msg}"
