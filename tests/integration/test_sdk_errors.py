"""Every official client against a gateway with API keys, a one-request limit and a dead worker:
each refusal reaches the application as the exception class that client raises for it, with
the fields the client parses from the error body.

openai-python (`_client.py` _make_status_error: 401 AuthenticationError, 429 RateLimitError,
>=500 InternalServerError; `_exceptions.py` APIError reads `code`, `param`, `type` from the
body's `error` object), huggingface_hub (`inference/_common.py` raise_text_generation_error:
TGI's `error_type` decides; chat raises HfHubHTTPError with the status), text-generation 0.7.0
(`errors.py` parse_error: `error_type` first, then the status) and elasticsearch-py
(elastic_transport HTTP_EXCEPTIONS: 401 AuthenticationException, else ApiError with the
status; `.message` is the ES error `type`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest
from elasticsearch import ApiError, AuthenticationException, Elasticsearch
from huggingface_hub import InferenceClient
from huggingface_hub import errors as hf_errors

from tests.integration import procs

pytestmark = pytest.mark.integration

KEY = "sekret"
MSG = [{"role": "user", "content": "hello"}]
SSE = {"accept": "text/event-stream", "content-type": "application/json"}
SLOW = [{"role": "user", "content": "hold the slot [[sim tokens=40 itl_ms=100]]"}]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("sdkerr")
    sim, sim_url = procs.simulator(tmp)
    dead = f"http://127.0.0.1:{procs.free_port()}"  # nothing listens there
    try:
        gw, gw_url = procs.gateway(tmp, f"""
server:
  api_keys: [{KEY}]
  max_concurrent_requests: 1
  timeouts: {{first_byte: 10, idle: 5}}
  failover_attempts: 0
default_model: demo
models:
  - name: demo
    backend: vllm
    upstreams: [{sim_url}]
  - name: gone
    backend: vllm
    upstreams: [{dead}]
""")
    except BaseException:
        sim.stop()
        raise
    try:
        yield gw_url
    finally:
        gw.stop()
        sim.stop()


@pytest.fixture
def oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=20)


def test_openai_authentication_error(url: str) -> None:
    """OpenAI's 401: `{"error": {"message", "type": "invalid_request_error", "param": null,
    "code": "invalid_api_key"}}`, which openai-python raises as AuthenticationError."""
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    for call in (lambda: bad.chat.completions.create(model="demo", messages=MSG),
                 lambda: bad.completions.create(model="demo", prompt="x"),
                 bad.models.list):
        with pytest.raises(openai.AuthenticationError) as err:
            call()
        e = err.value
        assert (e.status_code, e.code, e.type, e.param) == (401, "invalid_api_key",
                                                            "invalid_request_error", None)
        assert isinstance(e.body, dict) and e.body["message"] == e.message.split(" - ", 1)[1]
        assert e.response.headers["www-authenticate"]


def test_every_client_sees_the_concurrency_limit(url: str, oa: openai.OpenAI) -> None:
    """`max_concurrent_requests` (SPEC.md): beyond it a 429 with Retry-After in each client's
    error body: OpenAI's rate_limit_exceeded, TGI's `overloaded` (server.rs: InferError::
    Overloaded is 429 "Model is overloaded"), Elasticsearch's es_rejected_execution_exception."""
    hold = oa.chat.completions.create(model="demo", messages=SLOW, stream=True)
    try:
        assert next(iter(hold)).choices  # the one slot is taken while this stream is open
        with pytest.raises(openai.RateLimitError) as rl:
            oa.chat.completions.create(model="demo", messages=MSG)
        assert (rl.value.status_code, rl.value.code, rl.value.type) == (
            429, "rate_limit_exceeded", "rate_limit_error")
        assert int(rl.value.response.headers["retry-after"]) >= 1
        with pytest.raises(openai.RateLimitError):
            list(oa.completions.create(model="demo", prompt="x", stream=True))
        hf = InferenceClient(base_url=url, api_key=KEY, timeout=20)
        with pytest.raises(hf_errors.OverloadedError):
            hf.text_generation("hello", max_new_tokens=2)
        with pytest.raises(hf_errors.OverloadedError):
            list(hf.text_generation("hello", max_new_tokens=2, stream=True))
        with pytest.raises(hf_errors.HfHubHTTPError) as chat:
            hf.chat_completion(MSG, max_tokens=2)
        assert chat.value.response is not None and chat.value.response.status_code == 429
        es = Elasticsearch(url, api_key=KEY, request_timeout=20, max_retries=0)
        with pytest.raises(ApiError) as busy:
            es.inference.completion(inference_id="demo", input="x")
        assert (busy.value.status_code, busy.value.message) == (
            429, "es_rejected_execution_exception")
        with pytest.raises(ApiError) as busy_stream:
            es.perform_request("POST", "/_inference/chat_completion/demo/_stream",
                               headers=SSE, body={"messages": MSG})
        assert busy_stream.value.status_code == 429
    finally:
        hold.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # its own pydantic `.dict()` calls
def test_text_generation_client_errors(url: str, oa: openai.OpenAI) -> None:
    """text-generation 0.7.0 parse_error: TGI's `error_type` first (`overloaded` ->
    OverloadedError, `generation` -> GenerationError), in the sync and async clients."""
    import text_generation as tg  # installed by the test command (--no-deps)

    auth = {"authorization": f"Bearer {KEY}"}
    hold = oa.chat.completions.create(model="demo", messages=SLOW, stream=True)
    try:
        assert next(iter(hold)).choices
        with pytest.raises(tg.errors.OverloadedError, match="Model is overloaded"):
            tg.Client(url, headers=auth, timeout=20).generate("hello", max_new_tokens=2)
    finally:
        hold.close()

    async def stream_failure() -> None:
        client = tg.AsyncClient(url, headers=auth, timeout=20)
        got = []
        with pytest.raises(tg.errors.GenerationError, match="Simulated engine error"):
            async for r in client.generate_stream("go [[sim error_after=2]]", max_new_tokens=9):
                got.append(r.token.text)
        assert len(got) == 2  # the tokens before the failure arrived
        out = await client.generate("hello", max_new_tokens=2, best_of=2, do_sample=True)
        assert out.details.best_of_sequences and len(out.details.tokens) == 2

    asyncio.run(stream_failure())


def test_a_dead_worker_in_every_client(url: str, oa: openai.OpenAI) -> None:
    """No upstream of the model reachable: 503 before the first byte (SPEC.md), which
    openai-python raises as InternalServerError and elasticsearch-py as ApiError(503), on its
    streaming route as the `event: error` Elasticsearch sends with the status."""
    with pytest.raises(openai.InternalServerError) as dead:
        oa.chat.completions.create(model="gone", messages=MSG)
    assert (dead.value.status_code, dead.value.type) == (503, "server_error")
    assert "gone" in dead.value.message
    with pytest.raises(openai.InternalServerError):
        list(oa.chat.completions.create(model="gone", messages=MSG, stream=True))
    es = Elasticsearch(url, api_key=KEY, request_timeout=20, max_retries=0)
    with pytest.raises(ApiError) as whole:
        es.inference.completion(inference_id="gone", input="x")
    assert whole.value.status_code == 503
    assert whole.value.body["status"] == 503
    with pytest.raises(ApiError) as streamed:
        es.perform_request("POST", "/_inference/chat_completion/gone/_stream", headers=SSE,
                           body={"messages": MSG})
    assert streamed.value.status_code == 503
    assert streamed.value.body.startswith("event: error\ndata: {")
    with pytest.raises(AuthenticationException) as denied:
        Elasticsearch(url, api_key="wrong", max_retries=0).inference.completion(
            inference_id="demo", input="x")
    assert denied.value.message == "security_exception"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # text-generation's pydantic `.dict()`
def test_tgi_clients_read_a_refused_key_in_tgis_error_form(url: str) -> None:
    """A missing or wrong key on a TGI route is TGI's JSON error body, `{"error",
    "error_type"}` (issue 12, SPEC "Bad input ... in the calling protocol's error body"), so
    huggingface_hub's raise_text_generation_error raises its text-generation error with the
    message, streamed or not, and text-generation 0.7.0 (parse_error) its UnknownError."""
    import text_generation as tg  # installed by the test command (--no-deps)

    client = InferenceClient(base_url=url, api_key="wrong", timeout=20)
    for stream in (False, True):
        with pytest.raises(hf_errors.TextGenerationError, match="a valid API key is required"):
            list(client.text_generation("hello", max_new_tokens=2, stream=stream))
    with pytest.raises(tg.errors.UnknownError, match="a valid API key is required"):
        tg.Client(url, headers={"authorization": "Bearer wrong"}, timeout=20).generate("hi")


def test_openai_rate_limit_from_a_busy_worker(oa: openai.OpenAI) -> None:
    """A worker's own 429 (its rate limit, TGI's `overloaded`) with no other worker free: a
    429 that openai-python raises as RateLimitError, with OpenAI's rate-limit `code`
    ("rate_limit_exceeded", as the OpenAI API answers a 429) and type, as the gateway's own
    limit answers: not a `server_error` whose code says a worker is unavailable."""
    for call in (lambda: oa.chat.completions.create(
                     model="demo", messages=[{"role": "user", "content": "[[sim fail=429]]"}]),
                 lambda: oa.completions.create(model="demo", prompt="[[sim fail=429]]",
                                               stream=True)):
        with pytest.raises(openai.RateLimitError) as busy:
            call()
        assert (busy.value.code, busy.value.type) == ("rate_limit_exceeded", "rate_limit_error")
        assert "Simulated failure" in busy.value.message
