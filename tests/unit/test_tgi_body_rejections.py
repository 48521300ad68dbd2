"""TGI bodies that its axum `Json` extractor refuses get a 4xx before any stream, with axum's
plain-text rejection (axum 0.7 extract/rejection.rs: 400 syntax, 415 media type, 422 data);
the parameter checks TGI runs inside /generate_stream keep its in-stream error event."""

from __future__ import annotations

import httpx
import orjson
import pytest
import respx

from tests.unit.test_pipeline_respx import call

JSON = {"content-type": "application/json"}
DEEP = b'{"inputs": "x", "parameters": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"

# (body, headers, status, exact text or its start)
CASES: list[tuple[bytes, dict[str, str], int, str]] = [
    (b"", JSON, 400, "Failed to parse the request body as JSON: EOF while parsing a value"),
    (b"{not json", JSON, 400, "Failed to parse the request body as JSON: "),
    (b'{"inputs": "\xff\xfe"}', JSON, 400, "Failed to parse the request body as JSON: "),
    (b'{"inputs": "x", "parameters": {"temperature": NaN}}', JSON, 400,
     "Failed to parse the request body as JSON: "),
    (DEEP, JSON, 400, "Failed to parse the request body as JSON: "),
    (b'{"inputs": "hi"}', {"content-type": "text/plain"}, 415,
     "Expected request with `Content-Type: application/json`"),
    (b'{"inputs": "hi"}', {"content-type": "application/x-www-form-urlencoded"}, 415,
     "Expected request with `Content-Type: application/json`"),
    (b"[1, 2]", JSON, 422, "Failed to deserialize the JSON body into the target type: "
     "invalid type: sequence, expected struct GenerateRequest"),
    (b'"hi"', JSON, 422, "Failed to deserialize the JSON body into the target type: "
     'invalid type: string "hi", expected struct GenerateRequest'),
    (b'{"inputs": 5}', JSON, 422, "Failed to deserialize the JSON body into the target type: "
     "inputs: invalid type: integer `5`, "),
    (b"{}", JSON, 422, "Failed to deserialize the JSON body into the target type: "
     "missing field `inputs`"),
    (b'{"inputs": "x", "parameters": {"max_new_tokens": "many"}}', JSON, 422,
     "Failed to deserialize the JSON body into the target type: parameters.max_new_tokens: "
     'invalid type: string "many", '),
    (b'{"inputs": "x", "parameters": {"max_new_tokens": -1}}', JSON, 422,  # u32 in TGI
     "Failed to deserialize the JSON body into the target type: parameters.max_new_tokens: "
     "invalid value: integer `-1`, "),
]
IDS = ["empty", "syntax", "invalid-utf8", "nan", "deep", "text-plain", "form", "array",
       "string", "inputs-int", "no-inputs", "wrong-param-type", "negative-u32"]


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/generate_stream", "/generate", "/"])
@pytest.mark.parametrize(("body", "headers", "status", "text"), CASES, ids=IDS)
async def test_extractor_rejections_come_before_any_stream(
        path: str, body: bytes, headers: dict[str, str], status: int, text: str) -> None:
    with respx.mock(assert_all_called=False) as r:
        worker = r.post(url__startswith="http://up")
        resp = await call(r, body, headers=headers, path=path)
    assert worker.call_count == 0
    assert resp.status_code == status
    assert resp.headers["content-type"] == "text/plain; charset=utf-8"
    # TGI's compat route (POST /) extracts `CompatGenerateRequest` (server.rs compat_generate).
    assert resp.text.startswith(text.replace(
        "struct GenerateRequest", "struct CompatGenerateRequest" if path == "/" else
        "struct GenerateRequest"))
    assert "data:" not in resp.text


@pytest.mark.anyio
async def test_empty_body_text_is_serdes() -> None:
    with respx.mock(assert_all_called=False) as r:
        resp = await call(r, b"", headers=JSON, path="/generate_stream")
    assert resp.text == ("Failed to parse the request body as JSON: EOF while parsing a value "
                         "at line 1 column 0")


@pytest.mark.anyio
@pytest.mark.parametrize(("parameters", "message"), [
    ({"temperature": 0}, "Input validation error: `temperature` must be strictly positive"),
    ({"best_of": 2, "do_sample": True}, "Input validation error: `best_of` != 1 is not "
                                        "supported when streaming tokens"),
    ({"top_n_tokens": 9}, "Input validation error: `top_n_tokens` must be >= 0 and <= 5. "
                          "Given: 9"),
])
async def test_parameter_checks_stay_in_the_stream(parameters: dict[str, object],
                                                   message: str) -> None:
    """server.rs generate_stream_internal: validation errors are an event after HTTP 200."""
    with respx.mock(assert_all_called=False) as r:
        resp = await call(r, {"inputs": "hi", "parameters": parameters}, headers=JSON,
                          path="/generate_stream")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    event = orjson.loads(resp.content.removeprefix(b"data: ").strip())
    assert event == {"error": message, "error_type": "validation"}


@pytest.mark.anyio
async def test_a_body_without_content_type_is_read_as_json() -> None:
    """The one deviation from axum (tgi_extract.py): no Content-Type at all is JSON."""
    with respx.mock(assert_all_called=False) as r:
        resp = await call(r, b'{"inputs": 5}', path="/generate_stream")
    assert resp.status_code == 422


def test_cases_cover_the_issue() -> None:
    assert len({c[2] for c in CASES}) == 3 and len(IDS) == len(CASES)
    assert httpx.codes.UNSUPPORTED_MEDIA_TYPE == 415
