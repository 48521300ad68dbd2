"""Cross-references of a config (model names and aliases, `default_model`, workers' models
and ports), read from its plain data before validation, so that they are reported beside the
schema's errors however malformed the rest of it is."""

from __future__ import annotations

from typing import Any

from adapters import registry


def worker_models(raw: Any) -> list[dict[str, str]]:
    """The models that workers name and `models` does not (by name or alias), one entry each:
    `{"name", "backend"}`, the backend being the first such worker's protocol."""
    if not isinstance(raw, dict) or not isinstance(raw.get("workers"), list | tuple):
        return []
    models = raw.get("models") if isinstance(raw.get("models"), list | tuple) else []
    names = {n for n in _names(models) if isinstance(n, str)}
    implied: dict[str, dict[str, str]] = {}
    for w in raw["workers"]:
        model = w.get("model") if isinstance(w, dict) else None
        if isinstance(model, str) and model and model not in names and model not in implied:
            kind = w.get("kind")
            known = isinstance(kind, str) and kind in registry.WORKER_KINDS
            implied[model] = {"name": model, "backend": registry.WORKER_KINDS[kind].protocol
                              if known else registry.DEFAULT_BACKEND}
    return list(implied.values())


def _names(models: Any) -> list[Any]:
    """Every name and alias of `models` entries, in order, whatever their types."""
    found: list[Any] = []
    for m in models:
        m = m if isinstance(m, dict) else {}
        aliases = m.get("aliases")
        found += [m.get("name"), *(aliases if isinstance(aliases, list | tuple) else ())]
    return found


def problems(raw: Any) -> list[str]:
    """Every broken cross-reference (duplicate names or aliases, `default_model`,
    `workers[].model`, two workers on one port), read from plain data however malformed the
    rest of it is, so that one run reports them beside the field errors."""
    raw = raw if isinstance(raw, dict) else {}
    models = raw.get("models") if isinstance(raw.get("models"), list | tuple) else []
    models = [*models, *worker_models(raw)]
    names: dict[str, int] = {}
    found: list[str] = []
    for i, m in enumerate(models):
        m = m if isinstance(m, dict) else {}
        aliases = m.get("aliases")
        for name in (m.get("name"), *(aliases if isinstance(aliases, list | tuple) else ())):
            if not isinstance(name, str):
                continue
            if name in names:
                found.append(f"models[{i}]: name {name!r} is already used by "
                                f"models[{names[name]}]")
            names.setdefault(name, i)
    default = raw.get("default_model")
    if isinstance(default, str) and default not in names:
        found.append(f"default_model: {default!r} is not a model name")
    workers = raw.get("workers") if isinstance(raw.get("workers"), list | tuple) else []
    ports: dict[tuple[Any, int], int] = {}  # a second worker on one port could never listen
    for i, w in enumerate(workers):
        w = w if isinstance(w, dict) else {}
        model = w.get("model")
        if isinstance(model, str) and model not in names:
            found.append(f"workers[{i}].model: {model!r} is not a model name")
        port = w.get("port")
        if type(port) is int and port:
            where = (w.get("host", "127.0.0.1"), port)
            if where in ports:
                found.append(f"workers[{i}].port: {port} is already used by "
                                f"workers[{ports[where]}]")
            ports.setdefault(where, i)
    return found
