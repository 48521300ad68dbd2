"""Golden bytes of the Elastic front end: the unified chat API in both framings, the completion
task (JSON and stream), tools both ways, and both error kinds (SSE `event: error` with the
error's status; JSON bodies from the REST layer and the completion route).

Sources: seed 004 (`event: message` + `data: {"chat_completion": {chunk}}`, the chunk's fields,
the usage chunk with empty `choices`, `data: [DONE]`); Elasticsearch
`ServerSentEventsRestActionListener` (the BOM before every event, `event: error` with the
error's HTTP status and no [DONE], the done part), `StreamingUnifiedChatCompletionResults`
(field order, optional fields, `type` written even when null), `UnifiedChatCompletionException`
(code, message, type; `param` null), `ElasticsearchException.generateFailureXContent` (root_cause,
type, reason, status), `RestController` (X-elastic-product, the simple 406 error);
wire-formats.md section 7.

A case directory holds `route.txt` (the request line, then header lines), `request.json` (the
body, maybe empty), `events.jsonl` (the canonical events; a lone `raise` line is a failure
before the first event, which serving.py answers with render_error), and what we produce:
`upstream.txt` (the vLLM request built) and `response.txt` (status, headers, exact body). A
name ending in `_server` runs with `elastic.framing: server`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from adapters import base, registry
from adapters.frontends import elastic
from adapters.frontends import elastic_encode as enc
from schemas import elastic as wire
from schemas import errors
from tests.golden import runner

ROOT = runner.ROOT / "elastic"
CASES = runner.cases("elastic")
MODELS = ("demo", "my-chat")  # a model and its alias
GENERIC = b'{"error":{"root_cause"'  # ES's generic error, also on chat routes


def options(framing: str) -> dict[str, Any]:
    return {"name": "demo", "lmi": {}, "chat_template": None, "elastic": {"framing": framing}}


def context(path: str, headers: Mapping[str, str], framing: str) -> base.RequestContext:
    params = route_of(path)[1]

    def model_options(name: str | None) -> Mapping[str, Any]:
        return options(framing) if name is None or name in MODELS else {}

    return base.RequestContext(path, params, headers, model_options)


def route_of(path: str) -> tuple[base.Frontend, dict[str, str]]:
    """The registry's frontend for an Elastic path, as Starlette would match it."""
    for pattern, make in registry.INFERENCE_ROUTES:
        if not pattern.startswith("/_inference"):
            continue
        m = re.fullmatch(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern), path)
        if m:
            return make(), m.groupdict()
    raise AssertionError(f"no Elastic route for {path}")


def render_case(case: Path, update: bool) -> bytes:
    """The answer bytes as serving.py produces them: parse, worker check, a failure before the
    first event through render_error, else the stream (or the folded whole) from the events."""
    method_path, *header_lines = (case / "route.txt").read_text().splitlines()
    path = method_path.split()[1]
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(":") for line in header_lines if line.strip())}
    framing = "server" if case.name.endswith("_server") else "documented"
    t = runner.translate(route_of(path)[0], (case / "request.json").read_bytes(),
                         context(path, headers, framing), case, update)
    if isinstance(t, bytes):
        return t
    events, failure = runner.load_events(case / "events.jsonl")
    if failure is not None and not events:
        return runner.rendered(t.render_error(failure))
    meta = base.ResponseMeta("golden", 1700000000, t.request.model or "demo", "rid",
                             options(framing))
    return runner.answer(t, meta, events, failure, {"cache-control": "no-cache"})


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_elastic_answer_bytes(case: Path, update_goldens: bool) -> None:
    runner.check_bytes(case / "response.txt", render_case(case, update_goldens), update_goldens)


def test_every_elastic_case_is_present() -> None:
    names = {p.name for p in CASES}
    assert {"chat_whole", "chat_whole_tools", "chat_whole_unknown_endpoint",
            "chat_stream", "chat_stream_server", "chat_tools", "chat_tools_server",
            "chat_tool_messages", "chat_stream_error", "chat_stream_error_server",
            "chat_unknown_field", "chat_unknown_field_server", "chat_unknown_endpoint",
            "chat_worker_unavailable", "chat_bad_content_type", "completion_whole",
            "completion_stream", "completion_stream_server", "completion_unknown_field",
            "completion_stream_error"} <= names


def _events(body: bytes) -> list[tuple[str, bytes]]:
    """(event name, data) of each SSE event; every event is `event:` then `data:`."""
    out = []
    for block in body.split(b"\n\n")[:-1]:
        name, data = block.split(b"\n")
        assert name.removeprefix(enc.BOM).startswith(b"event: ")
        assert data.startswith(b"data: ")
        out.append((name.removeprefix(enc.BOM)[7:].decode(), data[6:]))
    return out


def test_goldens_validate_against_the_wire_models() -> None:
    """Every chunk, result and error in the goldens parses with schemas/elastic.py; the server
    framing puts a BOM before every event and the documented one before none."""
    for case in CASES:
        status, _, body = (case / "response.txt").read_bytes().partition(b"\n\n")
        server = case.name.endswith("_server")
        if b"text/event-stream" not in status:
            model = wire.SimpleError if b"406" in status.split(b"\n")[0] else wire.EsError
            if b"status: 200" in status:
                model = wire.ChatCompletion if case.name.startswith("chat_whole") \
                    else wire.CompletionResults  # type: ignore[assignment]
            elif case.name.startswith("chat_whole") and not body.startswith(GENERIC):
                model = wire.UnifiedError  # type: ignore[assignment]
            model.model_validate_json(body)
            continue
        assert body.count(enc.BOM) == (body.count(b"\n\n") if server else 0), case.name
        for name, data in _events(body):
            _validate_event(name, data, server, case.name.startswith("completion"))


def _validate_event(name: str, data: bytes, server: bool, completion: bool) -> None:
    if data == b"[DONE]":
        assert name == "message"
    elif name == "error":  # a chat route's generic errors: outside the unified wrapper
        generic = completion or data.startswith(GENERIC)
        (wire.EsError if generic else wire.UnifiedError).model_validate_json(data)
    elif completion:
        wire.StreamingCompletionResults.model_validate_json(data)
    elif server:
        wire.ChatCompletionChunk.model_validate_json(data)
    else:
        wire.ChunkEnvelope.model_validate_json(data)


# Every error class through every Elastic route: (route label, frontend, framing).
_ROUTES: list[tuple[str, base.Frontend]] = [
    ("chat documented", elastic.ElasticChatFrontend("documented")),
    ("chat server", elastic.ElasticChatFrontend("server")),
    ("chat whole", elastic.ElasticChatFrontend(stream=False)),
    ("completion", elastic.ElasticCompletionFrontend(False)),
    ("completion stream", elastic.ElasticCompletionFrontend(True)),
]


def test_elastic_error_bodies(update_goldens: bool) -> None:
    """Status, headers and body of every error class on every Elastic route."""
    out = b""
    for cls in sorted(errors.all_error_classes(), key=lambda c: c.__name__):
        for label, fe in _ROUTES:
            r = fe.render_error(cls("something went wrong", field="x"))
            assert r.headers["x-elastic-product"] == "Elasticsearch"
            out += f"{cls.__name__} {label}: ".encode() + runner.head(r.status, r.media_type, r.headers)
            out += r.body + b"\n"
    runner.check_bytes(ROOT / "errors.txt", out, update_goldens)


# GET _inference...: the inference endpoints of a gateway with a model, its alias and a second
# model (the listing sorted by id), in the media type asked for; refusals in ES's generic form.
_VIEW_MODELS = (
    base.ModelView("demo", ("my-chat",), "meta-llama/Llama-3.1-8B-Instruct", True),
    base.ModelView("alpha", (), "alpha", False),
)
_VIEW = base.GatewayView(_VIEW_MODELS, _VIEW_MODELS[0], "0", 0, 1, 1)
_COMPAT = {"accept": "application/vnd.elasticsearch+json; compatible-with=9"}
_GETS = [
    ("/_inference", _COMPAT), ("/_inference/_all", {}), ("/_inference/*", _COMPAT),
    ("/_inference/demo", _COMPAT), ("/_inference/my-chat", {}),
    ("/_inference/completion/demo", _COMPAT), ("/_inference/chat_completion/_all", _COMPAT),
    ("/_inference/Completion/_all", {}), ("/_inference/any/alpha", {}),
    ("/_inference/text_embedding/_all", _COMPAT),
    ("/_inference/nope", _COMPAT), ("/_inference/completion/nope", {}),
    ("/_inference/text_embedding/demo", {}), ("/_inference/bogus/demo", {}),
    ("/_inference/bogus/nope", {}),
]


def _get(path: str, headers: Mapping[str, str]) -> base.Rendered:
    """The registry's status route for `path`, as Starlette matches it (first match in order),
    with its refusals rendered by the route's error frontend, as status_routes.StatusEndpoint does."""
    for pattern, answer in registry.STATUS_ROUTES:
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern).replace("*", r"\*")
        if pattern.startswith("/_inference") and (m := re.fullmatch(regex, path)):
            ctx = base.RequestContext(path, m.groupdict(), headers)
            try:
                return answer(_VIEW, ctx)
            except errors.GatewayError as exc:
                return registry.STATUS_ERRORS[pattern]().render_error(exc)
    raise AssertionError(f"no Elastic status route for {path}")


def test_inference_endpoints(update_goldens: bool) -> None:
    """elasticsearch-py `inference.get` (GET _inference, _inference/{id},
    _inference/{task_type}/{id}, _inference/{task_type}/_all): RestGetInferenceModelAction's
    routes; TransportGetInferenceModelAction (`_all` / `*`, sorted by id, by task type, a
    single endpoint; `mismatchedTaskTypeException`); GetInferenceModelAction.Response
    (`{"endpoints": [...]}`); ModelConfigurations.toFilteredXContent (inference_id, task_type,
    service, service_settings; empty task_settings left out); TaskType.fromStringOrStatusException
    (`Unknown task_type [x]`); ModelRegistry (`Inference endpoint not found [x]`), all in
    elastic/elasticsearch. A path's unknown task type is refused before its id is looked up."""
    out = b""
    for path, headers in _GETS:
        r = _get(path, headers)
        assert r.headers["x-elastic-product"] == "Elasticsearch"
        out += f"GET {path}\n".encode() + runner.rendered(r) + b"\n\n"
    runner.check_bytes(ROOT / "endpoints.txt", out, update_goldens)
