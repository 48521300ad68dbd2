"""Golden bytes of the LMI / SageMaker front end, and the vLLM request each case becomes.

A case directory holds `request.json`, `case.json` (`path`, the model's `lmi` options, and the
`source` the bytes follow: a seed section or a DJL Serving v0.36.0 file), `events.jsonl` (the
canonical events; a blank line ends one upstream read, where the encoder is flushed; a
{"raise": ...} line fails the answer there) and the expected `response.txt` (status, media
type, exact body) and `upstream.txt` (the vLLM request built for it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters import base
from adapters.backends import vllm
from adapters.frontends import lmi, lmi_params, lmi_render
from schemas import canonical, errors
from schemas import events as ev
from tests.golden import runner

META = base.ResponseMeta(id="golden", created=1700000000, model="demo", request_id="rid")
TARGET = base.Target("http://worker:8000", "meta-llama/Llama-3.1-8B-Instruct")
CASES = runner.cases("lmi")


def context(case: Path) -> base.RequestContext:
    c = orjson.loads((case / "case.json").read_bytes())
    path: str = c["path"]
    params = {"model": path.rsplit("/", 1)[1]} if path.startswith("/predictions/") else {}
    options: dict[str, Any] = {"lmi": {"tgi_compat": False, "output_formatter": "jsonlines",
                                       **c.get("lmi", {})}}
    return base.RequestContext(path, params, {}, lambda _: options)


def read_batches(case: Path) -> tuple[list[list[ev.Event]], errors.GatewayError | None]:
    """Events grouped by upstream read (blank-line separated), and the failure, if any."""
    path = case / "events.jsonl"
    batches: list[list[ev.Event]] = []
    failure: errors.GatewayError | None = None
    for block in path.read_text().split("\n\n") if path.exists() else []:
        batch: list[ev.Event] = []
        for line in block.splitlines():
            d = orjson.loads(line)
            if "raise" in d:
                failure = getattr(errors, d["raise"])(d["message"])
            else:
                batch.append(runner.event_from_json(d))
        if batch:
            batches.append(batch)
    return batches, failure


def head(status: int, media_type: str) -> bytes:
    return f"status: {status}\ncontent-type: {media_type}\n\n".encode()


def render_case(case: Path) -> bytes:
    """The exact answer for a case, as serving.py drives the frontend."""
    fe = lmi.LmiFrontend()
    try:
        t = fe.parse((case / "request.json").read_bytes(), context(case))
    except errors.GatewayError as exc:
        r = fe.render_error(exc)
        return head(r.status, r.media_type) + r.body + b"\n"
    req = t.request
    batches, failure = read_batches(case)
    if failure is not None and (not req.stream or not batches):
        r = t.render_error(failure)  # before the first byte: the whole error response
        return head(r.status, r.media_type) + r.body + b"\n"
    meta = base.ResponseMeta(META.id, META.created, req.model or META.model)
    if not req.stream:
        done = canonical.Completion.fold([e for b in batches for e in b], req.choice_count,
                                         req.per_token)
        r = t.render(done, meta)
        return head(r.status, r.media_type) + r.body + b"\n"
    enc = t.encoder(meta)
    out = b"".join(b"".join(enc.encode(e) for e in b) + enc.flush() for b in batches)
    out += enc.fail(failure) if failure is not None else enc.finish()
    return head(200, enc.media_type) + out


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_lmi_answer_bytes(case: Path, update_goldens: bool) -> None:
    assert orjson.loads((case / "case.json").read_bytes())["source"], "cite the source"
    runner.check_bytes(case / "response.txt", render_case(case), update_goldens)


@pytest.mark.parametrize("case", [c for c in CASES if (c / "events.jsonl").exists()],
                         ids=lambda p: p.name)
def test_lmi_upstream_request(case: Path, update_goldens: bool) -> None:
    """What the vLLM worker is sent: LMI's names and defaults translated (max_new_tokens ->
    max_tokens with 30 by default, stop_sequences -> stop, greedy -> temperature 0, details ->
    return_token_ids and logprobs, decoder_input_details -> prompt_logprobs)."""
    req = lmi.LmiFrontend().parse((case / "request.json").read_bytes(), context(case)).request
    up = vllm.VllmBackend().build(req, TARGET)
    pretty = orjson.dumps(orjson.loads(up.body), option=orjson.OPT_INDENT_2)
    runner.check_bytes(case / "upstream.txt", f"{up.method} {up.url}\n".encode() + pretty + b"\n",
                       update_goldens)


def test_every_lmi_case_is_present() -> None:
    names = {p.name for p in CASES}
    assert {"rolling_whole", "rolling_stream_details", "rolling_stream_sse", "tgi_whole",
            "tgi_stream", "rolling_stream_error", "tgi_stream_error",
            "rolling_whole_generation_error", "rolling_invalid_parameter", "dynamic_whole",
            "dynamic_stream", "dynamic_stream_error", "chat_whole", "chat_stream", "chat_stream_sse",
            "chat_stream_error", "completion_whole", "completion_stream", "worker_down",
            "completion_stream_error"} <= names


def test_lmi_error_bodies(update_goldens: bool) -> None:
    """Every error class in each schema's error body, with its status and headers."""
    states = [None, *(lmi_params.LmiState(s, stream=stream) for s in ("chat", "completion", "rolling",
                                                                "dynamic")
                      for stream in (False, True))]
    out = b""
    for st in states:
        label = "no schema" if st is None else f"{st.schema} stream={st.stream}"
        out += f"== {label}\n".encode()
        for cls in sorted(errors.all_error_classes(), key=lambda c: c.__name__):
            r = lmi_render.render_error(cls("something <went> wrong", field="x"), st)
            hdrs = "".join(f"{k}: {v}\n" for k, v in sorted(r.headers.items()))
            out += f"{cls.__name__}: status {r.status}\n{hdrs}".encode() + r.body + b"\n"
    runner.check_bytes(runner.ROOT / "lmi_errors.txt", out, update_goldens)


def _view(healthy: bool) -> base.GatewayView:
    models = (base.ModelView("demo", (), "org/demo", healthy),
              base.ModelView("llama", (), "org/llama", True))
    return base.GatewayView(models, models[0], "0.1.0", 0, 1024, 1 << 20)


def test_ping_bytes(update_goldens: bool) -> None:
    """DJL /ping: GSON_PRETTY map of model -> status, then a newline (NettyUtils
    sendJsonResponse); 200 while the default model is healthy, 503 otherwise."""
    out = b""
    for healthy in (True, False):
        r = lmi.ping(_view(healthy), base.RequestContext())
        out += head(r.status, r.media_type) + r.body
    r = lmi.ping(base.GatewayView((), None, "0.1.0", 0, 1024, 1 << 20), base.RequestContext())
    out += head(r.status, r.media_type) + r.body
    runner.check_bytes(runner.ROOT / "lmi_ping.txt", out, update_goldens)
