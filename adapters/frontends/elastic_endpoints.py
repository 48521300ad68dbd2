"""Elastic client protocol: the inference endpoints the gateway's models are, as Elasticsearch
answers its get-endpoints API (elasticsearch-py `inference.get`).

GET _inference, _inference/_all, _inference/{id} and _inference/{task_type}/{id}
(RestGetInferenceModelAction): `{"endpoints": [...]}`, each endpoint in ModelConfigurations'
filtered form: inference_id, task_type, service, service_settings (task_settings only when
not empty; no chunking_settings for a text task). Every model name and alias is an inference
id the other Elastic routes take, so each is an endpoint, listed sorted by id as
TransportGetInferenceModelAction sorts them.

A gateway model serves both text tasks: it is a `chat_completion` endpoint, and a
`completion` one where the path asks for that task; any other task type in the path does not
match it. The service is `gateway` (the name the completion task's settings errors use) and
its settings say only which model the workers are asked for: no upstream address, no key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import orjson

from adapters import base
from adapters.frontends import elastic_encode as enc
from adapters.frontends import elastic_parse as check
from schemas import errors

SERVICE: Final = "gateway"
# The task an endpoint reports where the path names none (TaskType.ANY).
TASK: Final = "chat_completion"
# The text tasks a gateway model serves, each under its own path.
_SERVED: Final = frozenset({"chat_completion", "completion"})
# TaskType's constants, lower-cased (toString); `any` parses too (TaskType.fromString).
_TASK_TYPES: Final = frozenset({"text_embedding", "sparse_embedding", "rerank", "completion",
                                "any", "chat_completion", "embedding"})
# Strings.isAllOrWildcard.
_ALL: Final = frozenset({"_all", "*"})


def _endpoint(inference_id: str, task: str, model: base.ModelView) -> dict[str, Any]:
    return {"inference_id": inference_id, "task_type": task, "service": SERVICE,
            "service_settings": {"model_id": model.upstream_model}}


def _answer(endpoints: list[dict[str, Any]], ctx: base.RequestContext) -> base.Rendered:
    """GetInferenceModelAction.Response, in the media type the client asked for
    (RestToXContentListener)."""
    return base.Rendered(200, orjson.dumps({"endpoints": endpoints}), check.response_type(ctx),
                         dict(enc.PRODUCT_HEADERS))


def _names(view: base.GatewayView) -> dict[str, base.ModelView]:
    return {name: m for m in view.models for name in (m.name, *m.aliases)}


def task_type(name: str) -> str:
    """TaskType.fromStringOrStatusException: trimmed, any case; unknown is a 400."""
    task = name.strip().lower()
    if task not in _TASK_TYPES:
        raise errors.InvalidRequest(f"Unknown task_type [{name}]") \
            from enc.EsNote("status_exception")
    return task


def _get(view: base.GatewayView, ctx: base.RequestContext, inference_id: str,
         task: str) -> base.Rendered:
    """TransportGetInferenceModelAction.doExecute: all endpoints (of a task type), or one;
    an unknown id is ModelRegistry's 404, a task type that does not match its 400."""
    names = _names(view)
    if inference_id in _ALL:
        if task != "any" and task not in _SERVED:
            return _answer([], ctx)
        shown = TASK if task == "any" else task
        return _answer([_endpoint(n, shown, names[n]) for n in sorted(names)], ctx)
    model = names.get(inference_id)
    if model is None:
        raise errors.ModelNotFound(f"Inference endpoint not found [{inference_id}]")
    if task != "any" and task not in _SERVED:
        # InferenceExceptions.mismatchedTaskTypeException
        raise errors.InvalidRequest(
            f"Requested task type [{task}] does not match the inference endpoint's task type "
            f"[{TASK}]") from enc.EsNote("status_exception")
    return _answer([_endpoint(inference_id, TASK if task == "any" else task, model)], ctx)


def all_endpoints(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET _inference and _inference/_all."""
    return _get(view, ctx, "_all", "any")


def endpoint(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET _inference/{id}: `_all` or `*` lists them all."""
    return _get(view, ctx, ctx.path_params.get("id", ""), "any")


def task_endpoint(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET _inference/{task_type}/{id}: the task type is parsed first (the REST handler);
    `_all` or `*` lists the endpoints of that task type."""
    task = task_type(ctx.path_params.get("task_type", ""))
    return _get(view, ctx, ctx.path_params.get("id", ""), task)


# ---- the root (RestMainAction), for Elasticsearch's clients only: GET / is TGI's health ----

# The release whose API the Elastic front end answers as, with that release's Lucene and
# compatibility versions; `unknown` where Build has nothing to say (Build.Type.UNKNOWN).
_VERSION: Final = {
    "number": "9.1.0", "build_flavor": "default", "build_type": "unknown",
    "build_hash": "unknown", "build_date": "unknown", "build_snapshot": False,
    "lucene_version": "10.2.2", "minimum_wire_compatibility_version": "8.19.0",
    "minimum_index_compatibility_version": "8.0.0"}


def from_client(headers: Mapping[str, str]) -> bool:
    """Whether a request comes from an official Elasticsearch client: each sends
    `x-elastic-client-meta` (elastic-transport's client meta header), and elasticsearch-py
    8 / 9 ask for the compatible-with media type as well."""
    return "x-elastic-client-meta" in headers or any(
        headers.get(h, "").startswith("application/vnd.elasticsearch+json")
        for h in ("accept", "content-type"))


def main(view: base.GatewayView, ctx: base.RequestContext) -> base.Rendered:
    """GET / (and HEAD /, elasticsearch-py `info` and `ping`) as RestMainAction answers it:
    MainResponse.toXContent pretty-printed (the action's default) with a final newline, so
    that a client's first call passes its product check and reads a version."""
    body = {"name": SERVICE, "cluster_name": SERVICE, "cluster_uuid": "_na_",
            "version": _VERSION, "tagline": "You Know, for Search"}
    # XContentBuilder.prettyPrint: Jackson's DefaultPrettyPrinter, `"key" : value`, 2 spaces
    text = json.dumps(body, indent=2, separators=(",", " : "), ensure_ascii=False) + "\n"
    return base.Rendered(200, text.encode(), check.response_type(ctx), dict(enc.PRODUCT_HEADERS))
