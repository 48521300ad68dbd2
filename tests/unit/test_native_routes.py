"""The gateway's own server calls path-parameter routes natively too (FastPaths.match), with
Starlette's matching: the same endpoint and parameters Starlette's router would pick; where
Starlette must answer (no route, a method the route does not take) it gets the request."""

from __future__ import annotations

from gateway import app, config, http_cycle, serving

CFG = config.Config.model_validate({
    "models": [{"name": "demo", "backend": "vllm", "upstreams": ["http://127.0.0.1:9"]}]})


def test_a_path_parameter_route_is_matched_with_its_parameters() -> None:
    fast = app.build_app(CFG)
    found = fast.match("POST", "/_inference/chat_completion/demo/_stream")
    assert found is not None
    serve, params = found
    assert params == {"id": "demo"}
    owner = serve.__self__  # type: ignore[attr-defined]
    assert isinstance(owner, serving.ProtocolEndpoint)
    assert owner.route == "/_inference/chat_completion/{id}/_stream"


def test_route_order_decides_as_in_starlette() -> None:
    """`/_inference/chat_completion/_stream` fits `/_inference/{id}/_stream` only."""
    fast = app.build_app(CFG)
    found = fast.match("POST", "/_inference/chat_completion/_stream")
    assert found is not None
    assert found[0].__self__.route == "/_inference/{id}/_stream"  # type: ignore[attr-defined]
    assert found[1] == {"id": "chat_completion"}


def test_starlette_answers_what_no_native_endpoint_takes() -> None:
    fast = app.build_app(CFG)
    assert fast.match("GET", "/_inference/chat_completion/demo/_stream") is None  # 405 there
    assert fast.match("POST", "/no/such/path") is None  # 404 there
    assert fast.match("GET", "/metrics") is None  # an ASGI endpoint with no native form


def test_an_encoded_slash_stays_in_its_path_parameter() -> None:
    """elasticsearch-py percent-encodes a `/` in an inference id (`_quote`), and Elasticsearch
    splits the path before it decodes each part (RestUtils.decodeComponent), so
    `_inference/completion/org%2Fm` names the endpoint `org/m`: a model name with a slash."""
    fast = app.build_app(CFG)
    raw = b"/_inference/completion/org%2Fm/_stream"
    path = http_cycle.routing_path(raw, "/_inference/completion/org/m/_stream")
    found = fast.match("POST", path)
    assert found is not None
    assert found[0].__self__.route == "/_inference/completion/{id}/_stream"  # type: ignore[attr-defined]
    assert found[1] == {"id": "org/m"}
    assert http_cycle.routing_path(b"/v1/models/a%20b", "/v1/models/a b") == "/v1/models/a b"
    found = fast.match("GET", http_cycle.routing_path(b"/_inference/org%2fm", "/_inference/org/m"))
    assert found is not None and found[1] == {"id": "org/m"}
