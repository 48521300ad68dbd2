"""Golden bytes of the OpenAI front end: SSE framing, whole bodies and the error object.

Sources: OpenAI API reference (chat/streaming: `data: {...}` events, `data: [DONE]`, the usage
chunk with empty `choices` under `stream_options.include_usage`, `usage: null` on the other
chunks); openai-python 3.54.0 `types/chat/chat_completion_chunk.py` and
`types/shared/error_object.py` (`code` is a string); vLLM 0.11 `serving_chat.py` for the role
chunk, `stop_reason`, and the error event followed by `data: [DONE]`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters import base
from adapters.frontends import openai as frontend
from schemas import canonical, errors
from tests.golden import runner

META = base.ResponseMeta(id="golden", created=1700000000, model="demo", request_id="rid")


def _frontend(request: bytes) -> base.Frontend:
    if b'"messages"' in request:
        return frontend.OpenAIChatFrontend()
    return frontend.OpenAICompletionsFrontend()


def render_case(case: Path) -> bytes:
    """The exact answer bytes for a case, headed by its status and media type."""
    body = case.joinpath("request.json").read_bytes()
    fe = _frontend(body)
    t = fe.parse(body, base.RequestContext())
    req = t.request
    events, failure = runner.load_events(case / "events.jsonl")
    if req.stream:
        enc = t.encoder(META)
        out = b"".join(enc.encode(e) for e in events)
        out += enc.fail(failure) if failure else enc.finish()
        return b"status: 200\ncontent-type: " + enc.media_type.encode() + b"\n\n" + out
    done = canonical.Completion.fold(events, req.choice_count, req.per_token)
    r = t.render(done, META)
    return f"status: {r.status}\ncontent-type: {r.media_type}\n\n".encode() + r.body + b"\n"


@pytest.mark.parametrize("case", runner.cases("openai"), ids=lambda p: p.name)
def test_openai_answer_bytes(case: Path, update_goldens: bool) -> None:
    runner.check_bytes(case / "response.txt", render_case(case), update_goldens)


def test_every_openai_case_is_present() -> None:
    names = {p.name for p in runner.cases("openai")}
    assert {"chat_stream_usage", "chat_stream_error", "chat_whole", "completions_stream_logprobs",
            "chat_stream_tools", "chat_stream_n2_logprobs"} <= names


def test_openai_error_bodies(update_goldens: bool) -> None:
    """Every error class rendered as OpenAI's error object, with its status and headers."""
    out = b""
    for cls in sorted(errors.all_error_classes(), key=lambda c: c.__name__):
        r = frontend.OpenAIChatFrontend().render_error(cls("something went wrong", field="x"))
        headers = "".join(f"{k}: {v}\n" for k, v in sorted(r.headers.items()))
        out += f"{cls.__name__}: status {r.status}\n{headers}".encode() + r.body + b"\n"
    runner.check_bytes(runner.ROOT / "openai_errors.txt", out, update_goldens)
