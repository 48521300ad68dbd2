"""Environment overrides of the config, decided against the config model's own fields.

Only `GATEWAY_<SECTION>__<KEY>` variables whose path (double underscore between every level)
names a real setting apply. Kubernetes injects `GATEWAY_SERVICE_HOST`, `GATEWAY_PORT=tcp://...`
and `GATEWAY_PORT_8080_TCP_*` into every pod of a namespace holding a Service named `gateway`
(the kubelet's service links), and CI systems or shells set others: none of them names a
setting, so each is a warning naming the variable, never a crash (SPEC.md, Environment).

What a path may name: a field of a section (`GATEWAY_SERVER__TIMEOUTS__IDLE`), a whole field of
any kind as YAML (`GATEWAY_SERVER__API_KEYS='[k1, k2]'`; a list of texts also as `k1` or `k1,k2`), and an entry of a list of sections by
its index, when the file has that entry (`GATEWAY_MODELS__0__UPSTREAMS='[http://w:8000]'`).
Mappings (`workers[].env`) are set whole: their keys are case-sensitive, variable names are not.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel

PREFIX = "GATEWAY_"


@dataclass
class Applied:
    """What the environment did: warnings for variables that name no setting, and which
    variable set each location (so a bad value is reported with the variable's name)."""

    warnings: list[str] = field(default_factory=list)
    sources: dict[tuple[str | int, ...], str] = field(default_factory=dict)

    def source(self, loc: tuple[str | int, ...]) -> str | None:
        """The variable that set `loc` or a location above it."""
        for n in range(len(loc), 0, -1):
            if (name := self.sources.get(loc[:n])) is not None:
                return name
        return None


def apply(raw: dict[str, Any], environ: Mapping[str, str], model: type[BaseModel]) -> Applied:
    """Merge every variable that names a setting of `model` into `raw`, in name order."""
    done = Applied()
    for key in sorted(environ):
        if not key.upper().startswith(PREFIX):  # `gateway_server__port` too, as
            continue  # pydantic-settings reads names (case_sensitive=False by default)
        path = key[len(PREFIX):].lower().split("__")
        target, why = _resolve(path, model, raw)
        if target is None:
            done.warnings.append(f"{key}: ignored, {why} (overrides are "
                                 f"GATEWAY_<SECTION>__<KEY>, e.g. GATEWAY_SERVER__PORT)")
            continue
        node, last, annotation = target
        node[last] = parse_value(environ[key], annotation)
        done.sources[tuple(int(p) if p.isdigit() else p for p in path)] = key
    return done


Target = tuple[Any, str | int, Any]


def _resolve(path: list[str], model: type[BaseModel],
             raw: dict[str, Any]) -> tuple[Target | None, str]:
    """Walk `path` down the model's fields (and `raw`, creating sections on the way): the
    container and key to set, or None and why not."""
    node: Any = raw
    current: type[BaseModel] | None = model
    listed = False  # `current` is the entry class of a list: the next part is an index
    for depth, part in enumerate(path):
        here = ".".join(path[:depth + 1])
        last = depth == len(path) - 1
        if current is None:
            return None, f"`{'.'.join(path[:depth])}` has no settings below it"
        if listed:
            if not isinstance(node, list) or not part.isdigit() or int(part) >= len(node):
                return None, f"`{here}`: the config has no such entry"
            if last:
                return (node, int(part), current), ""
            node, listed = node[int(part)], False
            continue
        if part not in current.model_fields or not isinstance(node, dict):
            return None, f"`{here}` is not a setting"
        annotation = current.model_fields[part].annotation
        if last:
            return (node, part, annotation), ""
        section = _section(annotation)
        node = node.setdefault(part, {}) if section else node.get(part)
        current, listed = section or _entries(annotation), section is None
    return None, "it names no setting"


def _section(annotation: Any) -> type[BaseModel] | None:
    """The model class of a nested section (`server`, `server.timeouts`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _entries(annotation: Any) -> type[BaseModel] | None:
    """The entry class of a list of sections (`tuple[ModelConfig, ...]`), else None."""
    if typing.get_origin(annotation) in (tuple, list):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if len(args) == 1:
            return _section(args[0])
    return None


def parse_value(value: str, annotation: Any) -> Any:
    """A text setting keeps the variable's text as is (an API key `0123` stays a string, where
    YAML would read an octal number); a list or mapping of texts is read as YAML whose scalars
    all stay text; anything else is read as YAML (`9000`, `{tgi_compat: true}`)."""
    if _is_text(annotation):
        return value
    all_text = all(_is_text(a) for a in typing.get_args(annotation) if a is not Ellipsis)
    if typing.get_origin(annotation) in (tuple, list) and all_text and "\n" not in value \
            and not value.lstrip().startswith("["):
        # a list of texts as a manifest or a shell gives one: `k1` (a Secret holding one key)
        # or `k1,k2`, taken as written (no YAML reading of a key's `#` or `!`). Nothing in it
        # stays an error (validation names the variable): a Secret that lost its key must not
        # read as "no API keys", which opens every route.
        parts = [part.strip() for part in value.split(",") if part.strip()]
        return parts or value
    loader = yaml.BaseLoader if typing.get_args(annotation) and all_text else yaml.SafeLoader
    try:
        return yaml.load(value, Loader=loader) if value else value  # noqa: S506 (safe loaders)
    except yaml.YAMLError:
        return value  # validation then reports it, with the variable's name


def _is_text(annotation: Any) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:  # a checked text (BaseUrl)
        annotation = typing.get_args(annotation)[0]
    if annotation is str:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args == [str]
    return False
