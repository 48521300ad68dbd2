"""Golden transcripts of TGI and LMI token streams from workers that give no token ids
(trtllm-serve, Triton, a plain OpenAI server) and of vLLM's top-token ids, end to end through
the adapters: client request -> upstream request -> the worker's bytes -> the client's bytes.

SPEC.md ("Where the sources disagree"): the ids and log probs these formats always carry come
from the worker, else from the model's tokenizer, else -1 and null; a plain stream is never
refused. A case directory holds `request.json` ({"path", "kind", "tokenizer", "body"}: the
client route and body, the worker kind, whether the model has a tokenizer, here the simulator's
vocabulary made with `tokenizers` by tests/fakes/vocab.py; with `"plan": true` a whole answer
is asked of the worker as the pipeline asks it, gateway.whole), `upstream.txt` (the request built),
`worker.txt` (the worker fake's answer to it, tests/fakes/ and simulator/, reviewed by eye) and
`response.txt` (the exact bytes of the answer). The worker's bytes arrive in one read.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import orjson
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from tokenizers import Tokenizer

from adapters import base, registry, tokens
from gateway import config, whole
from schemas import canonical
from schemas import events as ev
from simulator import server, settings
from tests.fakes import triton_fake, trtllm_fake, vocab
from tests.golden import runner
from tests.matrix import harness

CASES = runner.cases("token_streams")
META_ID, CREATED = "golden", 1700000000


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory: pytest.TempPathFactory) -> tokens.Vocab:
    path = vocab.build(tmp_path_factory.mktemp("model"))
    return tokens.Vocab(Tokenizer.from_file(str(path)))


def options(spec: dict[str, Any], v: tokens.Vocab) -> dict[str, Any]:
    return {"name": "m", "lmi": {"tgi_compat": False, "output_formatter": "jsonlines"},
            "chat_template": harness.TEMPLATE, "elastic": {"framing": "documented"},
            "tokenizer": spec["tokenizer"],
            "special_token_ids": v.special if spec["tokenizer"] else frozenset()}


def frontend(path: str) -> base.Frontend:
    return next(make() for pattern, make in registry.INFERENCE_ROUTES if pattern == path)


def _fake(kind: str) -> Any:
    if kind == "trtllm":
        return trtllm_fake.app()
    if kind == "triton":
        return triton_fake.app()
    return server.build_app(settings.SimulatorSettings())


async def _record(kind: str, up: base.UpstreamRequest) -> bytes:
    """The worker fake's answer to `up` (used to write a missing worker.txt)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_fake(kind))) as client:
        r = await client.post(up.url, content=up.body, headers=up.headers)
        return r.content


def run(case: Path, v: tokens.Vocab, update: bool) -> bytes:
    spec = orjson.loads((case / "request.json").read_bytes())
    opts = options(spec, v)
    fe = frontend(spec["path"])
    ctx = base.RequestContext(spec["path"], {}, {}, lambda _: opts)
    t = fe.parse(orjson.dumps(spec["body"]), ctx)
    req = t.request
    backend = registry.backend(spec["kind"])
    backend.check(req)
    asked = t.request  # the client's: its stream flag picks the answer's form
    if spec.get("plan") and not req.stream:
        req, _ = whole.plan(backend, req, config.Timeouts(), spec["tokenizer"])
    up = backend.build(req, base.Target("http://worker:8000", "ensemble" if spec["kind"] ==
                                        "triton" else "org/m", opts))
    pretty = orjson.dumps(orjson.loads(up.body), option=orjson.OPT_INDENT_2)
    runner.check_bytes(case / "upstream.txt", f"{up.method} {up.url}\n".encode() + pretty
                       + b"\n", update)
    if not (case / "worker.txt").exists():
        (case / "worker.txt").write_bytes(asyncio.run(_record(spec["kind"], up)))
    dec = backend.decoder(req, up.streaming)
    if req.per_token and spec["tokenizer"]:
        dec = tokens.Tokenized(dec, v)
    events = dec.feed((case / "worker.txt").read_bytes()) + dec.close()
    meta = base.ResponseMeta(META_ID, CREATED, "m", "", opts)
    if not asked.stream:
        done = canonical.Completion.fold(events, req.choice_count, req.per_token)
        return t.render(done, meta).body
    enc = t.encoder(meta)
    return b"".join(enc.encode(e) for e in events) + enc.flush() + enc.finish()


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_token_stream(case: Path, vocabulary: tokens.Vocab, update_goldens: bool) -> None:
    runner.check_bytes(case / "response.txt", run(case, vocabulary, update_goldens),
                       update_goldens)


def test_the_cases_cover_every_worker_without_ids() -> None:
    seen = {(orjson.loads((c / "request.json").read_bytes())["path"],
             orjson.loads((c / "request.json").read_bytes())["kind"]) for c in CASES}
    for path in ("/generate_stream", "/invocations"):
        for kind in ("trtllm", "triton", "openai"):
            assert (path, kind) in seen


def test_text_is_split_into_tokens_over_chunk_boundaries(
        vocabulary: tokens.Vocab) -> None:
    """Text chunks that do not break at tokens (a worker holding text back for a stop
    string) are split by the tokenizer over what came so far, the last piece held until its
    end is known: the chunk's Finish, or the end of the answer."""
    chunks = [ev.TextDelta(0, " "), ev.TextDelta(0, "spel"), ev.TextDelta(0, "l the of"),
              ev.TextDelta(0, " xyz"), ev.Finish(0, "length")]
    dec = tokens.Tokenized(_Canned(chunks), vocabulary)
    assert dec.feed(b"") == [
        ev.TextDelta(0, " spell", [1163]), ev.TextDelta(0, " the", [1000]),
        ev.TextDelta(0, " of", [1001]), ev.TextDelta(0, " xyz", [0]),  # <unk>: its own id
        ev.Finish(0, "length")]
    dec = tokens.Tokenized(_Canned([ev.TextDelta(1, " the of")]), vocabulary)
    assert dec.feed(b"") == [ev.TextDelta(1, " the", [1000])]
    assert dec.close() == [ev.TextDelta(1, " of", [1001])]


class _Canned:
    failed = False

    def __init__(self, events: list[ev.Event]):
        self._events = events

    def feed(self, data: bytes) -> list[ev.Event]:
        return self._events

    def close(self) -> list[ev.Event]:
        return []


@hypothesis.settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 4000), max_size=8))
def test_any_chunking_gives_the_same_tokens(cuts: list[int], vocabulary: tokens.Vocab) -> None:
    """The held-back piece makes token ids independent of where the worker's reads fall."""
    case = runner.ROOT / "token_streams" / "tgi_stream_openai_tokenizer"
    spec = orjson.loads((case / "request.json").read_bytes())
    req = frontend(spec["path"]).parse(orjson.dumps(spec["body"]), base.RequestContext()).request
    body = (case / "worker.txt").read_bytes()
    points = sorted({min(c, len(body)) for c in cuts})

    def decode(parts: list[bytes]) -> list[ev.Event]:
        dec = tokens.Tokenized(registry.backend("openai").decoder(req, True), vocabulary)
        return [e for p in parts for e in dec.feed(p)] + dec.close()

    parts = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    assert decode(parts) == decode([body])
