"""The churn test's clients and judges: a mix of requests in every client protocol, each sent on
a raw asyncio connection (every read bounded), some left at a random point, and a check that
every answer read to its end is whole in its own protocol (SPEC.md, Behaviour under load,
faults and bad input: a complete stream, the protocol's in-band error and end, or an error
status with the protocol's error body; never a silent cut, a hang, a bare 500, a traceback).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

READ_TIMEOUT = 10.0  # seconds for a whole answer: far past every timeout the gateway has

# Faults the simulator injects (simulator/directives.py): before any byte, mid-stream, a stall.
SIM_FAULTS = ["", "", "", "", "[[sim fail=503]]", "[[sim fail=500]]", "[[sim fail=429]]",
              "[[sim drop_before]]", "[[sim drop_after=2]]", "[[sim hang_after=2]]",
              "[[sim error_after=2]]", "[[sim ttft_ms=2500]]", "[[sim fail=503 fail_times=1]]"]
# The TGI fake's (tests/fakes/tgi_fake.py): an error event, overloaded (429), a cut.
TGI_FAULTS = ["", "", "", "[[error_after=2]]", "[[overloaded]]", "[[drop_after=2]]"]
# How a client leaves: reads to the end, mid-body of its request, before the first byte, or
# after the first bytes of the answer.
LEAVES = ["full"] * 7 + ["body", "early", "mid"]


@dataclass
class Spec:
    """One request: where, what, and how its answer is judged."""

    rid: str
    path: str
    body: dict[str, Any]
    judge: str  # a key of JUDGES
    leave: str
    delay: float  # seconds before a leaving client closes


@dataclass
class Result:
    spec: Spec
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False  # the answer was read to its framing's end
    error: str = ""  # what the client saw instead (a timeout is a hang)


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def make(rng: random.Random, i: int, prefix: str, tgi_model: str) -> Spec:
    """The i-th request of the mix: a protocol, a worker fault in its prompt, a leave."""
    tgi = rng.random() < 0.2
    fault = rng.choice(TGI_FAULTS if tgi else SIM_FAULTS)
    text = f"churn {i} {fault}"
    model = tgi_model if tgi else "chat"
    stream = rng.random() < 0.7
    n = rng.choice([1, 1, 2])
    kinds: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/chat/completions", {"model": model, "messages": _chat(text), "stream": stream,
                                  "max_tokens": 8, "n": 1 if tgi else n,
                                  **({"stream_options": {"include_usage": True}}
                                     if stream and rng.random() < 0.5 else {})},
         "openai_sse" if stream else "openai_json"),
        (f"/predictions/{model}", {"inputs": text, "parameters": {"max_new_tokens": 8},
                                   "stream": stream}, "lmi_lines" if stream else "lmi_json"),
        (f"/_inference/chat_completion/{model}/_stream",
         {"messages": _chat(text), "max_completion_tokens": 8}, "elastic_sse"),
    ]
    if not tgi:  # routes to the default model, or that name the simulator's
        kinds += [
            ("/v1/completions", {"model": model, "prompt": text, "stream": stream,
                                 "max_tokens": 8, "n": n}, "openai_sse" if stream else "openai_json"),
            ("/invocations", {"messages": _chat(text), "max_tokens": 8, "stream": stream},
             "lmi_chat_lines" if stream else "openai_json_lmi"),
            ("/generate", {"inputs": text, "parameters": {"max_new_tokens": 8}}, "tgi_json"),
            ("/generate_stream", {"inputs": text, "parameters": {"max_new_tokens": 8}},
             "tgi_sse"),
            ("/", {"inputs": text, "parameters": {"max_new_tokens": 8}, "stream": stream},
             "tgi_sse" if stream else "tgi_json_list"),
            ("/v1/chat/completions", {"model": "tgi", "messages": _chat(text),
                                      "stream": stream, "max_tokens": 8},
             "tgi_chat_sse" if stream else "tgi_chat_json"),
            ("/_inference/chat_completion/chat/_unified",
             {"messages": _chat(text), "max_completion_tokens": 8}, "elastic_sse"),
            ("/_inference/completion/chat/_stream", {"input": text}, "elastic_sse"),
            ("/_inference/completion/chat", {"input": text}, "elastic_json"),
        ]
    path, body, judge = rng.choice(kinds)
    return Spec(f"{prefix}-{i}", path, body, judge, rng.choice(LEAVES), rng.uniform(0, 0.05))


# ---------------------------------------------------------------- the raw client


async def send(port: int, spec: Spec) -> Result:
    """One request on its own connection, left as `spec.leave` says; never longer than
    READ_TIMEOUT."""
    out = Result(spec)
    body = json.dumps(spec.body).encode()
    head = (f"POST {spec.path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            f"x-request-id: {spec.rid}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), READ_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        out.error = f"connect: {exc!r}"
        return out
    try:
        if spec.leave == "body":  # the head and half the body, then gone
            writer.write(head + body[: len(body) // 2])
            await writer.drain()
            await asyncio.sleep(spec.delay)
            return out
        writer.write(head + body)
        await writer.drain()
        if spec.leave == "early":
            await asyncio.sleep(spec.delay)
            return out
        await asyncio.wait_for(_read(reader, out), READ_TIMEOUT)
    except TimeoutError:
        out.error = "hang: no complete answer within the client's timeout"
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        out.error = f"cut: {exc!r}"
    finally:
        writer.transport.abort() if spec.leave != "full" else writer.close()
    return out


async def _read(reader: asyncio.StreamReader, out: Result) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    out.status = int(lines[0].split()[1])
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            out.headers[k.strip().lower()] = v.strip()
    if out.spec.leave == "mid":  # the first bytes of the answer, then gone
        await reader.read(64)
        await asyncio.sleep(out.spec.delay)
        return
    if out.headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if data[-2:] != b"\r\n":
                raise ValueError("bad chunk framing")
            if size == 0:
                break
            parts.append(data[:-2])
        out.body = b"".join(parts)
    elif "content-length" in out.headers:
        out.body = await reader.readexactly(int(out.headers["content-length"]))
    else:
        out.body = await reader.read()
    out.complete = True


# ---------------------------------------------------------------- judges


def _error_obj(body: bytes) -> bool:
    """OpenAI's error object: {"error": {"message": ...}}."""
    e = json.loads(body).get("error")
    return isinstance(e, dict) and isinstance(e.get("message"), str)


def _lmi_error(body: bytes) -> bool:
    """LMI / seed 003: {"error": ..., "code": N}."""
    e = json.loads(body)
    return isinstance(e.get("error"), str) and isinstance(e.get("code"), int)


def _tgi_error(body: bytes) -> bool:
    """TGI's ErrorResponse: {"error": ..., "error_type": ...}."""
    e = json.loads(body)
    return isinstance(e.get("error"), str) and isinstance(e.get("error_type"), str)


def _elastic_error(body: bytes) -> bool:
    """Elasticsearch's error body: {"error": {...}, "status": N}, or on a stream route one
    `event: error` with the HTTP status (SPEC.md, Elastic)."""
    if body.startswith(b"event: error\n") or body.startswith(b"\xef\xbb\xbfevent: error\n"):
        events = _sse(body)
        return len(events) == 1 and isinstance(json.loads(events[0][1]).get("error"), dict)
    e = json.loads(body)
    return isinstance(e.get("error"), dict) and isinstance(e.get("status"), int)


def _sse(body: bytes) -> list[tuple[str, str]]:
    """(event name, data) of each event; every event ends with a blank line."""
    text = body.decode()
    if body.startswith(b"\xef\xbb\xbf"):
        text = text.replace("\ufeff", "")
    assert text.endswith("\n\n"), "the stream does not end with a whole event"
    events = []
    for block in text[:-2].split("\n\n"):
        name, data = "message", None
        for line in block.split("\n"):
            key, _, value = line.partition(":")
            if key == "event":
                name = value.strip()
            elif key == "data":
                data = value[1:] if value.startswith(" ") else value
        assert data is not None, f"an event without data: {block!r}"
        events.append((name, data))
    return events


def _openai_sse(body: bytes, spec: Spec) -> None:
    events = _sse(body)
    assert events[-1][1] == "[DONE]", "no [DONE] terminator"
    chunks = [json.loads(d) for _, d in events[:-1]]
    errors = [i for i, c in enumerate(chunks) if "error" in c]
    if errors:
        assert errors == [len(chunks) - 1], "an error event that is not the last"
        return
    n = int(spec.body.get("n", 1))
    finished = {c["index"] for ch in chunks for c in ch.get("choices", [])
                if c.get("finish_reason")}
    assert finished == set(range(n)), f"choices finished {sorted(finished)} of {n}"


def _openai_json(body: bytes, spec: Spec) -> None:
    done = json.loads(body)
    n = int(spec.body.get("n", 1))
    assert len(done["choices"]) == n and all(c["finish_reason"] for c in done["choices"])


def _lmi_lines(body: bytes, spec: Spec) -> None:
    """Seed 003: the last token line carries `generated_text` (and `details` when asked);
    a failure's last line has `finish_reason: error` in its details."""
    lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
    last = lines[-1]
    assert isinstance(last.get("generated_text"), str), f"no final line: {last}"
    assert all("generated_text" not in x for x in lines[:-1]), "a final line before the last"


def _lmi_chat_lines(body: bytes, spec: Spec) -> None:
    lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
    assert any(c.get("finish_reason") for ch in lines for c in ch.get("choices", [])), \
        "no chunk ends the choice"


def _lmi_json(body: bytes, spec: Spec) -> None:
    assert isinstance(json.loads(body).get("generated_text"), str)


def _tgi_json(body: bytes, spec: Spec) -> None:
    assert isinstance(json.loads(body)["generated_text"], str)


def _tgi_json_list(body: bytes, spec: Spec) -> None:
    assert isinstance(json.loads(body)[0]["generated_text"], str)


def _tgi_sse(body: bytes, spec: Spec) -> None:
    last = json.loads(_sse(body)[-1][1])
    if "error" in last:
        assert isinstance(last.get("error_type"), str)
        return
    assert isinstance(last.get("generated_text"), str), f"no final token event: {last}"


def _elastic_sse(body: bytes, spec: Spec) -> None:
    events = _sse(body)
    name, data = events[-1]
    if name == "error":
        assert isinstance(json.loads(data).get("error"), dict)
        return
    assert (name, data) == ("message", "[DONE]"), f"no [DONE] terminator: {events[-1]}"
    for _, d in events[:-1]:
        json.loads(d)


def _elastic_json(body: bytes, spec: Spec) -> None:
    assert isinstance(json.loads(body)["completion"][0]["result"], str)


Judge = tuple[Callable[[bytes, Spec], None], Callable[[bytes], bool]]
JUDGES: dict[str, Judge] = {
    "openai_sse": (_openai_sse, _error_obj), "openai_json": (_openai_json, _error_obj),
    "openai_json_lmi": (_openai_json, _lmi_error),
    # TGI's Messages API: OpenAI's chunks, TGI's error body (server.rs ErrorResponse)
    "tgi_chat_sse": (_openai_sse, _tgi_error), "tgi_chat_json": (_openai_json, _tgi_error),
    "lmi_lines": (_lmi_lines, _lmi_error), "lmi_chat_lines": (_lmi_chat_lines, _lmi_error),
    "lmi_json": (_lmi_json, _lmi_error), "tgi_json": (_tgi_json, _tgi_error),
    "tgi_json_list": (_tgi_json_list, _tgi_error), "tgi_sse": (_tgi_sse, _tgi_error),
    "elastic_sse": (_elastic_sse, _elastic_error), "elastic_json": (_elastic_json, _elastic_error),
}


def judge(r: Result) -> str | None:
    """What is wrong with an answer read to its end (None: well formed)."""
    if r.spec.leave != "full":
        return None
    if not r.complete:
        return f"no complete answer: {r.error}"
    if b"Traceback" in r.body:
        return "a traceback in the answer"
    if r.headers.get("x-request-id") != r.spec.rid:
        return f"x-request-id {r.headers.get('x-request-id')!r} not echoed"
    whole, error = JUDGES[r.spec.judge]
    try:
        if r.status == 200:
            whole(r.body, r.spec)
        else:
            assert r.status >= 400, f"status {r.status}"
            assert error(r.body), "not the protocol's error body"
    except (AssertionError, ValueError, KeyError, IndexError, TypeError) as exc:
        return f"{r.status} {exc!r}: {r.body[-400:]!r}"
    return None
