"""Golden transcripts of the triton and tgi worker protocols: the upstream request built for a
representative client request, and the canonical events decoded from the worker's exact bytes.

A case directory (tests/golden/triton/*, tests/golden/tgi_worker/*) holds `request.json` (an
OpenAI chat or completions body, or a TGI body for cases named `generate_*` / `stream_*`),
`upstream.txt` (what we send, or why it is refused before any I/O), and where the worker
answers, `worker.txt` (its bytes) and `events.jsonl` (what we decode; a `raise` line when the
answer is an error). Worker bytes follow the real servers' code as tests/fakes/ cite it:
Triton src/http_server.cc and the TensorRT-LLM ensemble (keys in byte order, no finish reason,
no terminator, stop words kept); TGI router lib.rs / server.rs / chat.rs @ db931fcf (v3.3.7).
The triton cases use Meta-Llama-3-8B-Instruct's chat template (`chat_template.jinja`).
`worker.txt` files are the fakes' answers to the `upstream.txt` request, reviewed by eye; two
are edited from them: `triton/chat_stream_truncated` (its last event lost its blank line) and
`triton/completions_stream_no_counts` (an older ensemble without `num_*_tokens` outputs).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from adapters import base, registry
from adapters.frontends import openai as openai_frontend
from adapters.frontends import tgi as tgi_frontend
from schemas import canonical, errors
from tests.golden import runner

# directory -> registry backend name
KINDS = {"triton": "triton", "tgi_worker": "tgi"}
TEMPLATE = (runner.ROOT / "triton" / "chat_template.jinja").read_text()
CASES = [c for kind in KINDS for c in runner.cases(kind)]


def target(case: Path) -> base.Target:
    if case.parent.name == "triton":
        return base.Target("http://triton:8000/", "ensemble",
                           {"name": "llama", "chat_template": TEMPLATE})
    return base.Target("http://tgi:8080", "meta-llama/Llama-3.1-8B-Instruct", {"name": "llama"})


def parse(case: Path) -> canonical.InferenceRequest:
    body = (case / "request.json").read_bytes()
    ctx = base.RequestContext()
    if case.name.startswith(("generate_", "stream_")):
        mode: tgi_frontend.Mode = "stream" if case.name.startswith("stream_") else "generate"
        return tgi_frontend.TgiFrontend(mode).parse(body, ctx).request
    if b'"messages"' in body:
        return openai_frontend.OpenAIChatFrontend().parse(body, ctx).request
    return openai_frontend.OpenAICompletionsFrontend().parse(body, ctx).request


def _refusal(exc: errors.GatewayError) -> bytes:
    return (f"refused {exc.status} {type(exc).__name__} (field {exc.field}): "
            f"{exc.message}\n").encode()


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_upstream_request(case: Path, update_goldens: bool) -> None:
    req = parse(case)
    backend = registry.backend(KINDS[case.parent.name])
    try:
        backend.check(req)
        up = backend.build(req, target(case))
    except errors.GatewayError as exc:
        runner.check_bytes(case / "upstream.txt", _refusal(exc), update_goldens)
        assert not (case / "worker.txt").exists(), "a refused request reaches no worker"
        return
    pretty = orjson.dumps(orjson.loads(up.body), option=orjson.OPT_INDENT_2)
    head = f"{up.method} {up.url}\nstreaming: {str(up.streaming).lower()}\n"
    runner.check_bytes(case / "upstream.txt", head.encode() + pretty + b"\n", update_goldens)


WORKER_CASES = [c for c in CASES if (c / "worker.txt").exists()]


@pytest.mark.parametrize("case", WORKER_CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_worker_bytes_to_events(case: Path, update_goldens: bool) -> None:
    req = parse(case)
    backend = registry.backend(KINDS[case.parent.name])
    up = backend.build(req, target(case))
    dec = backend.decoder(req, streaming=up.streaming)
    try:
        events = dec.feed((case / "worker.txt").read_bytes()) + dec.close()
        text = runner.dump_events(events)
    except errors.GatewayError as exc:
        text = orjson.dumps({"raise": type(exc).__name__, "status": exc.status,
                             "message": exc.message}).decode() + "\n"
    runner.check_bytes(case / "events.jsonl", text.encode(), update_goldens)


@pytest.mark.parametrize("case", WORKER_CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_worker_bytes_decode_the_same_one_byte_at_a_time(case: Path) -> None:
    """Any chunking gives the same events (here the hardest: one byte per read)."""
    req = parse(case)
    backend = registry.backend(KINDS[case.parent.name])
    up = backend.build(req, target(case))
    data = (case / "worker.txt").read_bytes()

    def run(parts: list[bytes]) -> str:
        dec = backend.decoder(req, streaming=up.streaming)
        try:
            events = [e for p in parts for e in dec.feed(p)] + dec.close()
            return runner.dump_events(events)
        except errors.GatewayError as exc:
            return f"{type(exc).__name__}: {exc.message}"

    assert run([data[i:i + 1] for i in range(len(data))]) == run([data])
