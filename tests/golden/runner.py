"""Golden transcripts: canonical events as JSON lines, expected bytes as files.

A case directory holds `request.json` (the client's request body), `events.jsonl` (the
canonical events the worker side produced; a line {"raise": "UpstreamBroken", "message": ...}
ends the stream with that error), and the exact expected bytes of the answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from adapters import base
from adapters.backends import vllm
from schemas import canonical, errors
from schemas import events as ev

ROOT = Path(__file__).parent

_EVENT_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls for cls in
    (ev.Role, ev.TextDelta, ev.ReasoningDelta, ev.ToolCallDelta, ev.Finish, ev.Usage,
     ev.PromptInfo)
}


def event_to_json(e: ev.Event) -> dict[str, Any]:
    return {"type": type(e).__name__, **dataclasses.asdict(e)}


def event_from_json(d: dict[str, Any]) -> ev.Event:
    d = dict(d)
    cls = _EVENT_TYPES[d.pop("type")]
    if "logprobs" in d and d["logprobs"] is not None:
        d["logprobs"] = [_token_logprob(t) if t is not None else None for t in d["logprobs"]]
    return cls(**d)  # type: ignore[no-any-return]


def _token_logprob(t: dict[str, Any]) -> ev.TokenLogprob:
    top = [ev.TopLogprob(**a) for a in t.get("top", [])]
    return ev.TokenLogprob(**{**t, "top": top})


def load_events(path: Path) -> tuple[list[ev.Event], errors.GatewayError | None]:
    out: list[ev.Event] = []
    failure: errors.GatewayError | None = None
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        d = orjson.loads(line)
        if "raise" in d:
            failure = getattr(errors, d["raise"])(d["message"])
        else:
            out.append(event_from_json(d))
    return out, failure


def dump_events(events: list[ev.Event]) -> str:
    return "".join(orjson.dumps(event_to_json(e)).decode() + "\n" for e in events)


def cases(protocol: str) -> list[Path]:
    base = ROOT / protocol
    return sorted(p for p in base.iterdir() if p.is_dir()) if base.exists() else []


def check_bytes(path: Path, actual: bytes, update: bool) -> None:
    """Compare with the golden file, or rewrite it under --update-goldens."""
    if update or not path.exists():
        path.write_bytes(actual)
        if not update:
            raise AssertionError(f"{path} did not exist; written now, review and re-run")
        return
    expected = path.read_bytes()
    assert actual == expected, (
        f"{path.name} differs\n--- expected\n{expected.decode('utf-8', 'replace')}\n"
        f"--- actual\n{actual.decode('utf-8', 'replace')}")


TARGET = base.Target("http://worker:8000", "meta-llama/Llama-3.1-8B-Instruct")


def head(status: int, media_type: str, headers: Mapping[str, str]) -> bytes:
    """A transcript's head: status, media type (none sent: no line), then the other headers
    sorted."""
    lines = "".join(f"{k}: {v}\n" for k, v in sorted(headers.items()))
    ctype = f"content-type: {media_type}\n" if media_type else ""
    return f"status: {status}\n{ctype}{lines}\n".encode()


def rendered(r: base.Rendered) -> bytes:
    return head(r.status, r.media_type, r.headers) + r.body


def translate(fe: base.Frontend, body: bytes, ctx: base.RequestContext, case: Path,
              update: bool) -> base.Translator | bytes:
    """As serving.py before the first byte: parse, then the vLLM worker's check (a refusal's
    answer bytes instead of a translator), with the worker's request compared to the case's
    `upstream.txt`."""
    try:
        t = fe.parse(body, ctx)
    except errors.GatewayError as exc:
        return rendered(fe.render_error(exc))
    try:
        vllm.VllmBackend().check(t.request)
    except errors.GatewayError as exc:
        return rendered(t.render_error(exc))
    up = vllm.VllmBackend().build(t.request, TARGET)
    pretty = orjson.dumps(orjson.loads(up.body), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    check_bytes(case / "upstream.txt", f"{up.method} {up.url}\n".encode() + pretty + b"\n", update)
    return t


def answer(t: base.Translator, meta: base.ResponseMeta, events: list[ev.Event],
           failure: errors.GatewayError | None, stream_headers: Mapping[str, str]) -> bytes:
    """The stream (its encoder's headers over `stream_headers`), the events as one read of the
    worker's (flushed after it, as serving.py does), or the folded whole."""
    req = t.request
    if req.stream:
        enc = t.encoder(meta)
        out = b"".join(enc.encode(e) for e in events) + enc.flush()
        out += enc.fail(failure) if failure else enc.finish()
        return head(200, enc.media_type, {**stream_headers, **enc.headers}) + out
    done = canonical.Completion.fold(events, req.choice_count, req.per_token)
    return rendered(t.render(done, meta)) + b"\n"
