"""Golden transcripts: canonical events as JSON lines, expected bytes as files.

A case directory holds `request.json` (the client's request body), `events.jsonl` (the
canonical events the worker side produced; a line {"raise": "UpstreamBroken", "message": ...}
ends the stream with that error), and the exact expected bytes of the answer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson

from schemas import errors
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
