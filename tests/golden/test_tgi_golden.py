"""Golden bytes of the TGI front end: /generate, /generate_stream, POST /, the Messages API on
/v1/chat/completions, /info, /health and every error.

Sources: TGI router @ db931fcf (v3.3.7) `lib.rs` (GenerateResponse, Details, BestOfSequence,
StreamResponse, StreamDetails, Token, PrefillToken, Info, ChatCompletion, ChatCompletionChunk,
ErrorResponse: field order and skip_serializing_if), `server.rs` (generate_internal,
generate_stream_internal: index from 1, generated_text and details only on the last event, no
`[DONE]`, every error of a stream as an event after HTTP 200; compat_generate: the array body and
return_full_text on by default; health; From<InferError>), `validation.rs` (messages), axum >= 0.7
SSE (`data: ` with a space); wire-formats.md section 4.

A case directory is named for its route (generate_, stream_, compat_, chat_) and holds
`request.json`, the canonical events (`events.jsonl`) or a worker's bytes (`worker.txt`, vLLM's
completions API, decoded by our vLLM decoder; `tgi_worker.txt`, a TGI worker's answer to the
request our tgi backend builds, as tests/fakes/tgi_fake.py writes it, decoded by our tgi
decoder), the vLLM request we build (`upstream.txt`) and the exact answer (`response.txt`).
Sampling requests without a seed get GOLDEN_SEED (validation.rs draws a random one).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from adapters import base
from adapters.backends import tgi as tgi_backend
from adapters.backends import vllm
from adapters.frontends import openai, tgi
from schemas import canonical, errors
from schemas import events as ev
from schemas import tgi as wire
from tests.golden import runner

META = base.ResponseMeta(id="golden", created=1700000000, model="demo", request_id="rid")
# The seed drawn for a sampling request that names none (tgi.draw_seed, validation.rs).
GOLDEN_SEED = 1234567890123456789
CASES = runner.cases("tgi")
TGI = runner.ROOT / "tgi"


MODES: dict[str, tgi.Mode] = {"generate": "generate", "stream": "stream", "compat": "compat"}


@pytest.fixture(autouse=True)
def fixed_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tgi, "draw_seed", lambda: GOLDEN_SEED)


def frontend(case: Path) -> base.Frontend:
    route = case.name.split("_", 1)[0]
    if route == "chat":
        return openai.OpenAIChatFrontend()
    return tgi.TgiFrontend(MODES[route])


def events_of(case: Path, req: canonical.InferenceRequest
              ) -> tuple[list[ev.Event], errors.GatewayError | None]:
    if (case / "tgi_worker.txt").exists():  # a TGI worker's bytes (backend `tgi`)
        backend = tgi_backend.TgiBackend()
        up = backend.build(req, runner.TARGET)
        dec = backend.decoder(req, streaming=up.streaming)
        return dec.feed((case / "tgi_worker.txt").read_bytes()) + dec.close(), None
    worker = case / "worker.txt"
    if not worker.exists():
        return runner.load_events(case / "events.jsonl")
    dec = vllm.VllmBackend().decoder(req, streaming=req.stream)
    return dec.feed(worker.read_bytes()) + dec.close(), None


def render_case(case: Path, update: bool) -> bytes:
    """The answer bytes, as serving.py produces them: parse, worker check, then the stream or
    the folded whole; an error before the first byte is the frontend's render_error."""
    t = runner.translate(frontend(case), (case / "request.json").read_bytes(),
                         base.RequestContext(), case, update)
    if isinstance(t, bytes):
        return t
    events, failure = events_of(case, t.request)
    meta = base.ResponseMeta(META.id, META.created, t.request.model or META.model,
                             META.request_id)
    return runner.answer(t, meta, events, failure, {})


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_tgi_answer_bytes(case: Path, update_goldens: bool) -> None:
    runner.check_bytes(case / "response.txt", render_case(case, update_goldens), update_goldens)


def test_every_tgi_case_is_present() -> None:
    names = {p.name for p in CASES}
    assert {"generate_details", "generate_prefill_top_tokens", "generate_best_of",
            "stream_details_top_tokens", "stream_error", "stream_invalid_temperature",
            "compat_whole", "compat_stream", "chat_stream_tgi"} <= names


def test_generate_answers_validate_against_tgi_models() -> None:
    """Every /generate, / and /generate_stream golden parses with the wire models."""
    for case in CASES:
        status, _, body = (case / "response.txt").read_bytes().partition(b"\n\n")
        if case.name.startswith("chat_") or b"status: 200" not in status:
            continue
        if b"text/event-stream" in status:
            for line in body.split(b"\n\n"):
                if line.startswith(b"data: {\"index\""):
                    wire.StreamResponse.model_validate_json(line[6:])
        elif case.name.startswith("compat_"):
            wire.GenerateResponse.model_validate(orjson.loads(body)[0])
        else:
            wire.GenerateResponse.model_validate_json(body)


def _view(healthy: bool) -> base.GatewayView:
    model = base.ModelView("demo", ("d",), "meta-llama/Llama-3.1-8B-Instruct", healthy)
    return base.GatewayView((model,), model, "0.1.0", 1700000000, 128, 10485760)


def test_info_and_health_bytes(update_goldens: bool) -> None:
    ctx = base.RequestContext("/info")
    out = b""
    for name, r in [("GET /info", tgi.info(_view(True), ctx)),
                    ("GET /health healthy", tgi.health(_view(True), ctx)),
                    ("GET /health unhealthy", tgi.health(_view(False), ctx))]:
        out += name.encode() + b"\n" + runner.rendered(r) + b"\n\n"
    runner.check_bytes(TGI / "status_routes.txt", out, update_goldens)
    wire.Info.model_validate_json(tgi.info(_view(True), ctx).body)


def test_tgi_error_bodies(update_goldens: bool) -> None:
    """Every error class through every TGI route: status, headers and ErrorResponse."""
    out = b""
    for cls in sorted(errors.all_error_classes(), key=lambda c: c.__name__):
        for mode in ("generate", "stream", "compat"):
            r = tgi.TgiFrontend(mode).render_error(cls("something went wrong", field="x"))
            if cls is errors.MalformedBody:  # axum's plain-text rejection (tgi_extract.py)
                assert r.media_type == "text/plain; charset=utf-8"
            else:
                wire.ErrorResponse.model_validate_json(r.body.removeprefix(b"data: "))
            out += f"{cls.__name__} {mode}: ".encode() + runner.head(r.status, r.media_type, r.headers)
            out += r.body + b"\n"
    runner.check_bytes(TGI / "errors.txt", out, update_goldens)


def test_tgi_chat_finish_rides_on_the_last_tokens_chunk_of_its_read() -> None:
    """TGI writes the finish reason on the last token's own chunk (chat.rs
    create_event_from_stream_token: `finish_reason` from the token's details). A worker read
    that ends with the last token and its finish gives one chunk; a finish that comes in a
    later read (vLLM's empty final delta) gets its own chunk, and no token waits past its read."""
    fe = openai.OpenAIChatFrontend()
    t = fe.parse(orjson.dumps({"model": "tgi", "stream": True,
                               "messages": [{"role": "user", "content": "Hi"}]}),
                 base.RequestContext())
    enc = t.encoder(META)

    def read(*events: ev.Event) -> list[dict[str, object]]:
        out = b"".join(enc.encode(e) for e in events) + enc.flush()
        return [orjson.loads(x.removeprefix(b"data: "))["choices"][0]
                for x in out.split(b"\n\n") if x]

    assert read(ev.TextDelta(0, "Deep")) == [
        {"index": 0, "delta": {"role": "assistant", "content": "Deep"}, "logprobs": None,
         "finish_reason": None}]
    assert [(c["delta"]["content"], c["finish_reason"]) for c in read(
        ev.TextDelta(0, " learning"), ev.Finish(0, "eos"))] == [(" learning", "stop")]
    enc = t.encoder(META)
    assert [(c["delta"]["content"], c["finish_reason"]) for c in read(ev.TextDelta(0, "a"))] \
        == [("a", None)]
    assert [(c["delta"]["content"], c["finish_reason"]) for c in read(ev.Finish(0, "length"))] \
        == [("", "length")]
