"""A worker's request-validation text reaches the client as "`field`: message", never whole.

Sources: NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_server.py (validation_exception_handler:
400 `{"error": str(exc)}`); fastapi/fastapi fastapi/exceptions.py (ValidationException.__str__
since 0.124: a count, each pydantic error dict's repr with the body as `input`, then the
endpoint's file, line and path; before 0.124 `str(exc)` was the error list's repr);
vllm-project/vllm vllm/entrypoints/serve/utils/server_utils.py (validation_exception_handler:
ErrorResponse 400 whose message is the count and the dicts' reprs, `param` "body.<field>").
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import respx

from adapters import registry
from adapters.backends import error_text, openai_decode
from gateway import config
from schemas import errors
from tests import leaks
from tests.fakes import trtllm_fake, trtllm_shapes
from tests.unit.test_pipeline_respx import UP1, UP2, call, healthy
from tests.unit.test_worker_errors import CLIENTS, IDS

BODY = {"model": "demo", "messages": [{"role": "user", "content": "secret prompt"}],
        "guided_regex": "a+"}
# trtllm-serve's answer to BODY: its `guided_regex` is an extra ChatCompletionRequest forbids.
TRTLLM_400 = trtllm_shapes.validation_error(
    trtllm_fake._errors(BODY, trtllm_fake.ALLOWED_CHAT), "/v1/chat/completions")
MISSING = {"type": "missing", "loc": ("body", "messages", 0, "content"),
           "msg": "Field required", "input": BODY}
# vLLM: the same lines from exc.errors(), in its nested ErrorResponse.
VLLM_400 = orjson.dumps({"error": {
    "message": f"2 validation errors:\n  {MISSING}\n  {MISSING}", "type": "Bad Request",
    "param": "body.messages.0.content", "code": 400}})
# FastAPI before 0.124: str(exc) is the error list's repr.
OLD_FASTAPI_400 = orjson.dumps({"error": str([MISSING])})


def test_the_leak_scanner_finds_what_a_worker_validation_error_holds() -> None:
    """The suite-wide check (tests/conftest.py) would catch the text passed on whole."""
    assert set(leaks.scan(TRTLLM_400)) == {"server file path", "validation error repr"}
    assert leaks.scan(VLLM_400) == ["validation error repr"]
    assert leaks.scan(b'{"error":"`guided_regex`: Extra inputs are not permitted"}') == []


@pytest.mark.parametrize(("backend", "body", "message", "field"), [
    ("trtllm", TRTLLM_400, "`guided_regex`: Extra inputs are not permitted", "guided_regex"),
    ("vllm", VLLM_400, "`messages[0].content`: Field required (and 1 more error)",
     "messages[0].content"),
    ("trtllm", OLD_FASTAPI_400, "`messages[0].content`: Field required",
     "messages[0].content"),
], ids=["trtllm", "vllm", "fastapi-before-0.124"])
def test_a_validation_error_is_its_first_field_and_reason(
        backend: str, body: bytes, message: str, field: str) -> None:
    exc = registry.backend(backend).parse_error(400, body)
    assert isinstance(exc, errors.UpstreamRejected) and exc.status == 400
    assert (exc.message, exc.field) == (message, field)
    assert body.decode()[:200] in (exc.detail or "")  # the text stays in the log line


def test_a_model_level_validator_names_no_field() -> None:
    """A `mode="before"` validator's error is at `('body',)` (openai_protocol.py
    ChatCompletionRequest.check_stream_options): its message alone."""
    data = {"model": "m", "messages": [], "stream_options": {"include_usage": True}}
    body = trtllm_shapes.validation_error(trtllm_fake._errors(data, trtllm_fake.ALLOWED_CHAT),
                                          "/v1/chat/completions")
    exc = registry.backend("trtllm").parse_error(400, body)
    assert (exc.message, exc.field) == (
        "Value error, Stream options can only be defined when stream is true.", None)


@pytest.mark.parametrize("body", [
    # vLLM >= 0.10 ErrorResponse (nested), a VLLMValidationError from a model-level validator:
    # FastAPI's loc is ('body',) and vLLM's `param` names the field (clean_loc_for_param)
    b'{"error":{"message":"Value error, top_logprobs must be between 0 and 20",'
    b'"type":"BadRequestError","param":"body.top_logprobs","code":400}}',
    # older flat ErrorResponse, and a param without the prefix
    b'{"object":"error","message":"top_logprobs must be between 0 and 20",'
    b'"type":"BadRequestError","param":"top_logprobs","code":400}',
])
def test_the_workers_param_names_the_field_when_its_text_does_not(body: bytes) -> None:
    """vLLM's error `param` names the field its message does not (vllm/entrypoints/serve/utils/
    server_utils.py validation_exception_handler, clean_loc_for_param): an OpenAI client's
    error then names it too, as from vLLM."""
    exc = registry.backend("vllm").parse_error(400, body)
    assert exc.field == "top_logprobs"
    assert registry.backend("vllm").parse_error(500, body).field is None


def test_other_worker_messages_pass_on_unchanged() -> None:
    body = b'{"object":"error","message":"1 validation errors are too many","code":400}'
    exc = registry.backend("trtllm").parse_error(400, body)
    assert exc.message == "1 validation errors are too many" and exc.field is None


def _trtllm_config() -> config.Config:
    return config.Config.model_validate({
        "default_model": "demo",
        "models": [{"name": "demo", "backend": "trtllm", "upstreams": [UP1, UP2],
                    "upstream_model": "org/model", "routing": "round_robin"}]})


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body", "message"), CLIENTS, ids=IDS)
async def test_every_client_reads_the_field_not_the_workers_text(
        path: str, body: dict[str, Any], message: Any) -> None:
    with respx.mock(assert_all_called=False) as r:
        healthy(r)
        route = r.post(url__startswith="http://up").mock(
            return_value=httpx.Response(400, content=TRTLLM_400,
                                        headers={"content-type": "application/json"}))
        resp = await call(r, body, cfg=_trtllm_config(), path=path)
    assert route.call_count == 1 and 400 <= resp.status_code < 500
    assert message(resp.json()).endswith("`guided_regex`: Extra inputs are not permitted")
    assert leaks.scan(resp.content) == [] and b"secret prompt" not in resp.content


@pytest.mark.parametrize("body", [
    b'{"error": {"code": 500, "trace": ["/srv/app.py", 12]}}', b'{"detail": {"a": 1}}',
    b'{"status": "down", "hosts": ["10.0.0.5"]}', b"[1, 2]", b'{"error": ["x"]}'])
def test_an_error_body_with_no_message_text_gives_none(body: bytes) -> None:
    """A worker's JSON error body without message text was read as its Python repr (dict and
    list reprs, whatever the body held); none now, so the client reads "the worker answered
    HTTP ..." and the log line keeps the body."""
    assert error_text.message(body) == ""
    assert openai_decode.in_band_error(orjson.loads(body)).message in (
        "the worker failed: the worker reported an error",
        "the worker reported an error")
