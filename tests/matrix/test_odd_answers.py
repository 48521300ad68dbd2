"""A worker whose answer holds odd values (tests/matrix/odd_answers.py: one or two JSON values of
a right answer spoiled, for every worker kind and every client protocol) never makes the
gateway fail as a bug: each client gets either a right answer, or the worker's refusal or
failure in its own protocol's form (STYLE.md section 5: a malformed answer is UpstreamBroken,
502; after the first byte an in-band error where the protocol has one). A fifth of the
worker's answers are error statuses with odd bodies (not JSON, or its own error body spoiled). The compiled build runs this file
too (tests/integration/test_compiled_build.py), and there compares every answer with the
pure build's."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from gateway import observability
from tests.matrix import harness
from tests.matrix.odd_answers import Outcome, outcomes

OPENAI_ERROR = {"message", "type", "param", "code"}
# client protocol -> whether a JSON body is its error body for a status (before the first byte)
ERROR_SHAPES: dict[str, Callable[[Any, int], bool]] = {
    "openai_chat": lambda o, _: set(o["error"]) == OPENAI_ERROR,
    "openai_completions": lambda o, _: set(o["error"]) == OPENAI_ERROR,
    "lmi_chat": lambda o, status: set(o) == {"error", "code"} and o["code"] == status,
    "lmi_inputs": lambda o, status: set(o) == {"error", "code"} and o["code"] == status,
    "tgi": lambda o, _: set(o) == {"error", "error_type"},
    "elastic_completion": lambda o, status: o["status"] == status and "reason" in o["error"],
}


def sse_events(body: bytes) -> list[tuple[str, Any]]:
    """(event name, JSON data or "[DONE]") of each event; a data line that is not JSON fails."""
    out = []
    for block in body.split(b"\n\n"):
        if not block:
            continue
        name, data = "message", None
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                raw = line[5:].strip()
                data = "[DONE]" if raw == b"[DONE]" else orjson.loads(raw)
        out.append((name, data))
    return out


def stream_verdict(client: str, body: bytes) -> str:
    """ "ok", "failed" (the worker's failure, told in-band), or what is wrong with the stream."""
    if client.startswith("lmi"):  # JSON lines; a failure is the last line's "error" finish
        # read as DJL's Python clients read them: its json.dumps writes a log prob of -inf
        # (which the gateway's TGI decoder makes of a worker's null) as -Infinity
        last = [json.loads(line) for line in body.splitlines() if line.strip()][-1]
        finishes = [c.get("finish_reason") for c in last.get("choices", ())]
        if "error" in finishes or (last.get("details") or {}).get("finish_reason") == "error":
            return "failed"
        return "ok" if finishes or "generated_text" in last else f"unended: {last}"
    events = sse_events(body)
    name, last = events[-1]
    if client == "tgi":  # TGI: the error is the last event, with no [DONE]; a refusal too
        if "error" in last:
            if set(last) != {"error", "error_type"}:
                return f"error form: {last}"
            return "refused" if last["error_type"] == "validation" else "failed"
        return "ok" if last.get("generated_text") is not None else f"unended: {last}"
    if client.startswith("elastic"):  # Elasticsearch: `event: error`, the stream's last
        if name == "error":
            return "failed" if "error" in last else f"error form: {last}"
        return "ok" if last == "[DONE]" else f"unended: {last}"
    if last != "[DONE]":  # OpenAI (vLLM): an error event, then [DONE]
        return f"unended: {last}"
    errors = [data for _, data in events[:-1] if "error" in data]
    if not errors:
        return "ok"
    return "failed" if set(errors[0]["error"]) == OPENAI_ERROR else f"error form: {errors[0]}"


def error_verdict(o: Outcome) -> str:
    """A 4xx is the worker's refusal passed on, a 5xx its failure: in the client's error form."""
    if o.client == "elastic_chat":  # Elasticsearch's _stream: an error is an SSE event
        name, data = sse_events(o.body)[-1]
        told = name == "error" and {"code", "message", "type"} <= set(data["error"])
    elif o.client == "elastic_completion" and o.stream:  # the same, holding its error body
        name, data = sse_events(o.body)[-1]
        told = name == "error" and ERROR_SHAPES[o.client](data, o.status)
    else:
        told = ERROR_SHAPES[o.client](orjson.loads(o.body), o.status)
    if not told:
        return f"error form {o.status}"
    return "refused" if o.status < 500 else "failed"


def verdict(o: Outcome) -> str:
    if o.status == 500 or b"internal gateway error" in o.body:
        return "internal error"
    if 400 <= o.status < 500 or o.status in (502, 503, 504):
        return error_verdict(o)
    if o.status != 200:
        return f"status {o.status}"
    if not o.stream:  # (LMI's as its Python clients read it: see stream_verdict)
        (json.loads if o.client.startswith("lmi") else orjson.loads)(o.body)
        return "ok"
    return stream_verdict(o.client, o.body)


@pytest.mark.anyio
async def test_odd_worker_answers_are_answered_or_failed_in_the_clients_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bugs: list[BaseException] = []
    monkeypatch.setattr(observability, "log_bug", lambda rid, exc: bugs.append(exc))
    found = await outcomes(seed=17, count=500)
    verdicts = Counter((verdict(o), o.stream) for o in found)
    wrong = [(verdict(o), o.line()[:600]) for o in found
             if verdict(o) not in ("ok", "failed", "refused")]
    assert wrong == [] and bugs == []
    # every kind of outcome was met, and most odd values pass as the real servers' do
    assert verdicts[("failed", False)] >= 10 and verdicts[("failed", True)] >= 30
    assert verdicts[("refused", False)] >= 10 and verdicts[("refused", True)] >= 10
    assert verdicts[("ok", True)] + verdicts[("ok", False)] > len(found) // 2
    assert {o.kind for o in found} == {"vllm", "openai", "trtllm", "triton", "tgi",
                                        "triton-legacy"}
    assert {o.client for o in found} == set(harness.CLIENTS)


@pytest.mark.anyio
async def test_with_a_spare_worker_no_failure_before_the_first_byte_reaches_the_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC.md: a worker refusing or failing before the first byte is retried on another
    upstream. Beside the odd worker, a second of its kind answers rightly: a whole answer
    is then never the odd one's failure, nor its 429 or 5xx (a 4xx of the request's own fault
    is passed on); a stream fails only after its first byte, where it cannot be continued
    (a tool call, or a worker that cannot continue a chat). That found a Triton 429 passed
    on (the other backends retried it), a TGI 424 not retried, and a TGI 4xx whose
    `error_type` TGI never writes answered as a 502."""
    bugs: list[BaseException] = []
    monkeypatch.setattr(observability, "log_bug", lambda rid, exc: bugs.append(exc))
    found = await outcomes(seed=29, count=600, spare=True)
    assert [o.line()[:400] for o in found if verdict(o) not in ("ok", "failed", "refused")
            or (verdict(o) == "failed" and not o.stream) or o.status in (429, 502, 503, 504)
            ] == []
    assert bugs == [] and sum(verdict(o) == "ok" for o in found) > 450


@pytest.mark.anyio
async def test_an_answer_cut_short_and_continued_on_a_spare_worker_is_the_whole_answer() -> None:
    """SPEC.md `failover_attempts`: a stream whose worker fails after the first byte is
    continued on another worker, and the client sees one stream. The odd worker's answers
    end at a random byte; beside it, a right worker of the kind. Each client then gets the
    very bytes of the uncut answer (ids and times aside), or, where the stream cannot be
    continued (a tool call; a chat on a worker that cannot continue one), the failure in its
    own form. TGI's fake continues a chat but not a prompt (a real model continues any), so
    its prompts' continuations are only checked to be answers or failures in form."""
    cut = await outcomes(seed=41, count=300, framing="cut short", spare=True)
    plain = await outcomes(seed=41, count=300, framing="plain")
    wrong = [(a.line()[-300:], b.line()[-300:]) for a, b in zip(cut, plain, strict=True)
             if a.line() != b.line()
             and verdict(a) not in (("ok", "failed") if a.kind == "tgi" else ("failed",))]
    assert wrong == []
    assert sum(a.line() == b.line() and a.stream for a, b in zip(cut, plain, strict=True)) > 100


PLAIN: dict[int, list[Outcome]] = {}  # the worker's own framing's answers, by seed: made once


@pytest.mark.anyio
@pytest.mark.parametrize("framing", ["crlf", "comment", "fields", "bom", "cut reads"])
async def test_right_answers_framed_otherwise_are_answered_as_usual(framing: str) -> None:
    """SSE's CRLF line ends, comments, `event`/`id`/`retry` fields and a leading BOM (WHATWG
    HTML 9.2.6), a whole answer's BOM (RFC 8259 8.1), and reads cut at any byte: every
    worker kind, every client protocol, answered, log probs, tool calls and several choices
    too."""
    found = await outcomes(seed=3, count=130, framing=framing)
    plain = PLAIN.get(3) or PLAIN.setdefault(3, await outcomes(seed=3, count=130,
                                                               framing="plain"))
    # (what a worker kind cannot give, asked for by name, is refused before any answer)
    assert [o.line()[:400] for o in found if verdict(o) not in ("ok", "refused")] == []
    assert sum(verdict(o) == "ok" for o in found) > 100
    # and each the same bytes as the worker's own framing gives: not an event lost
    assert [(a.line()[:300], b.line()[:300]) for a, b in zip(found, plain, strict=True)
            if a.line() != b.line()] == []


def test_the_verdicts_tell_a_failure_from_a_broken_stream() -> None:
    done = b'data: {"choices":[]}\n\ndata: [DONE]\n\n'
    failed = b'data: {"error":{"message":"m","type":"t","param":null,"code":"c"}}\n\n' \
        b"data: [DONE]\n\n"
    assert stream_verdict("openai_chat", done) == "ok"
    assert stream_verdict("openai_chat", failed) == "failed"
    assert stream_verdict("openai_chat", b'data: {"choices":[]}\n\n').startswith("unended")
    assert stream_verdict("elastic_chat", b'event: error\ndata: {"error":{}}\n\n') == "failed"
    assert stream_verdict("tgi", b'data: {"error":"x","error_type":"generation"}\n\n') == "failed"
    assert stream_verdict("tgi", b'data: {"error":"x","error_type":"validation"}\n\n') \
        == "refused"
    assert stream_verdict("tgi", b'data: {"token":{},"generated_text":null}\n\n') \
        .startswith("unended")
    assert stream_verdict("lmi_inputs", b'{"token":{}}\n').startswith("unended")
    assert verdict(Outcome(0, "vllm", "tgi", False, 500, b"{}")) == "internal error"
    assert verdict(Outcome(0, "vllm", "tgi", False, 422, b'{"error":"x","error_type":"v"}')) \
        == "refused"
    assert verdict(Outcome(0, "vllm", "lmi_chat", False, 424, b'{"error":"x","code":400}')) \
        == "error form 424"
    with pytest.raises(orjson.JSONDecodeError):
        stream_verdict("openai_chat", b"data: {cut\n\n")
