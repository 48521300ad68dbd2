"""Model names and aliases to the route a request takes: backend adapter, upstreams, names."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from adapters import base, chat_template, registry, tokens
from gateway import balancer, board, config, tokenizer
from schemas import canonical, errors


@dataclass(slots=True)
class Route:
    """Everything the pipeline needs to serve one model."""

    config: config.ModelConfig
    backend: base.Backend
    upstreams: balancer.Upstreams
    options: dict[str, Any] = field(default_factory=dict)  # for frontends, as plain data
    vocab: tokens.Vocab | None = None  # the model's tokenizer, when one is known
    # Read from the (frozen) config once, here: pydantic's BaseModel defines `__getattr__`, so
    # each read of a config attribute goes through CPython's slot hook (two type lookups)
    # before the instance's dict, and every request read these several times.
    name: str = field(init=False)
    upstream_model: str = field(init=False)  # the name the worker serves it under

    def __post_init__(self) -> None:
        self.name = self.config.name
        self.upstream_model = self.config.upstream_model or self.config.name

    def decoder(self, req: canonical.InferenceRequest, streaming: bool) -> base.StreamDecoder:
        """The worker's decoder; with the model's tokenizer, token ids filled in for clients
        whose format carries them (`per_token`)."""
        dec = self.backend.decoder(req, streaming)
        if req.per_token and self.vocab is not None:
            return tokens.Tokenized(dec, self.vocab)
        return dec


def chat_template_text(value: str | None, index: int) -> str | None:
    """`models[].chat_template`: inline Jinja2 text, or the path of a file that holds it
    (SPEC.md). A value without `{` cannot be a template, so it must name a readable file
    (relative to the working directory); the file is read once, here: adapters do no I/O.
    Either is compiled now: a template that does not parse is a config error at startup, not
    a 500 on every chat request to the model."""
    if not value:
        return value
    text = value
    if "{" not in value:
        try:
            text = Path(value).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise config.ConfigError(
                [f"models[{index}].chat_template: {value!r} is not a Jinja2 template and not a "
                 f"readable file ({why})"]) from None
    try:
        chat_template.compile_template(text)
    except errors.GatewayError as exc:
        raise config.ConfigError([f"models[{index}].chat_template: {exc.message}"]) from None
    return text


def model_dir_template(m: config.ModelConfig, workers: Iterable[config.WorkerConfig]
                       ) -> str | None:
    """The chat template of the local model directory a managed worker serves the model from
    (gateway/tokenizer.py `model_dir`), which that worker's chat route renders with when
    started without a template of its own: transformers' `chat_template.jinja`, else
    tokenizer_config.json's `chat_template` (a string, or named templates: "default";
    tokenization_utils_base.py). Not when the worker's `args` name a template, nor when none
    is readable: a default, never an error."""
    names = {m.name, *m.aliases}
    if any(w.model in names and any("chat_template" in a or "chat-template" in a
                                    for a in w.args) for w in workers):
        return None
    directory = tokenizer.model_dir(m, workers)
    if directory is None:
        return None
    try:
        jinja = directory / "chat_template.jinja"
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        found = orjson.loads((directory / "tokenizer_config.json").read_bytes()).get(
            "chat_template")
    except (OSError, UnicodeDecodeError, orjson.JSONDecodeError, AttributeError):
        return None
    if isinstance(found, list):
        found = next((t.get("template") for t in found
                      if isinstance(t, dict) and t.get("name") == "default"), None)
    return found if isinstance(found, str) and found else None


def file_problems(models: Any) -> list[str]:
    """Every unreadable `chat_template` or `tokenizer` file of raw `models` entries, so that
    check-config reports them in the same run as the schema's problems (issue: check-config)."""
    out: list[str] = []
    for i, m in enumerate(models if isinstance(models, list) else ()):
        if not isinstance(m, dict):
            continue
        try:
            if isinstance(m.get("chat_template"), str):
                chat_template_text(m["chat_template"], i)
        except config.ConfigError as exc:
            out += exc.problems
        try:
            if isinstance(m.get("tokenizer"), str) and m["tokenizer"]:
                tokenizer.load(tokenizer.tokenizer_file(m["tokenizer"]), f"models[{i}].tokenizer")
        except config.ConfigError as exc:
            out += exc.problems
    return out


class Router:
    """Resolves client-facing model names; `None` means the default model."""

    def __init__(self, cfg: config.Config, listener: balancer.Listener | None = None,
                 shared: board.Board | None = None):
        """`listener` hears the upstreams' health changes (the app passes gateway.hooks);
        `shared`: the board of the serving processes, when there are several."""
        self.routes: dict[str, Route] = {}
        self._by_name: dict[str, Route] = {}
        for i, m in enumerate(cfg.models):
            vocab = tokenizer.for_model(m, i, cfg.workers)
            template = chat_template_text(m.chat_template, i) if m.chat_template \
                else model_dir_template(m, cfg.workers)
            options: dict[str, Any] = {
                "name": m.name, "chat_template": template,
                **{k: v.model_dump() for k, v in m.protocol_options().items()},
                **{k: v.model_dump() for k, v in cfg.protocol_options().items()},
                # the worker may name tokens by id (vLLM return_tokens_as_token_ids)
                "tokenizer": vocab is not None,
                "special_token_ids": vocab.special if vocab else frozenset()}
            ups = balancer.Upstreams(m.upstreams, m.routing, cfg.server.health, model=m.name,
                                     listener=listener)
            ups.board = shared
            route = Route(m, registry.backend(m.backend), ups, options, vocab)
            self.routes[m.name] = route
            for name in (m.name, *m.aliases):
                self._by_name[name] = route
        default = cfg.default_model or (cfg.models[0].name if cfg.models else None)
        # an alias names its model here too (config accepts one as `default_model`)
        self.default = self._by_name.get(default) if default else None

    def resolve(self, name: str | None) -> Route:
        if name is None or name == "":
            if self.default is None:
                raise errors.ModelNotFound("no model named and no `default_model` configured",
                                           field="model")
            return self.default
        route = self._by_name.get(name)
        if route is None:
            raise errors.ModelNotFound(f"The model `{name}` does not exist.", field="model")
        return route

    def options(self, name: str | None) -> dict[str, Any]:
        """A model's frontend options, or {} for a name that does not resolve."""
        try:
            return self.resolve(name).options
        except errors.ModelNotFound:
            return {}
