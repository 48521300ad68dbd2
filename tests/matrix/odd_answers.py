"""Worker answers with odd values in them, for every worker kind and every client protocol: a
loopback worker that asks the in-process fake of its kind (tests/matrix/harness.py) for the
right answer to the gateway's request, spoils one or two of its JSON values (a wrong type, a
huge or negative number, an empty, nested or long value, a key gone, an event that is no
object), and sends the result as that worker would, one HTTP/1.1 chunk an event. The gateway
in front of it is `gateway serve`'s own app, with its own upstream client (gateway.http1).

`outcomes(seed, count)` draws `count` cases from `seed` and returns what each client got;
`Outcome.line` writes it as one line with the per-answer ids and times blanked, which this
module prints when run, so that two builds of the gateway (pure and compiled,
tests/integration/test_compiled_build.py) can be compared answer by answer.

    python -m tests.matrix.odd_answers SEED COUNT [spare]
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
from dataclasses import dataclass
from typing import Any

import httpx

from gateway import app as gateway_app
from gateway import config, observability
from simulator import server, settings
from tests.fakes import tgi_fake, triton_fake, trtllm_fake
from tests.integration.odd_requests import ODD
from tests.matrix import harness

KINDS = ("vllm", "openai", "trtllm", "triton", "tgi", "triton-legacy")
CASES = [(client, stream) for client, (_, _, modes) in harness.CLIENTS.items()
         for stream in modes]
# Each kind's own error body (wire-formats.md): vLLM's nested ErrorResponse (and any OpenAI
# server's), trtllm-serve's flat one, Triton's and TGI's objects; and the statuses they come with
ERRORS: dict[str, Any] = {
    "vllm": {"error": {"message": "m", "type": "BadRequestError", "param": None, "code": 400}},
    "openai": {"error": {"message": "m", "type": "invalid_request_error", "param": "n",
                         "code": None}},
    "trtllm": {"object": "error", "message": "m", "type": "BadRequestError", "param": None,
               "code": 400},
    "triton": {"error": "m"},
    "triton-legacy": {"error": "m"},
    "tgi": {"error": "m", "error_type": "validation"},
}
ERROR_STATUSES = (400, 404, 413, 422, 424, 429, 500, 503)
NOT_JSON = (b"", b"<html><body>502 Bad Gateway</body></html>", b"null", b"{", b"\xff\xfe")
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
NAMED = {"type": "function", "function": {"name": "f"}}
# What a request may ask for besides text, by client protocol, so that the worker's answer
# holds log probs, several choices, tool calls, token details (a body's top-level keys, or
# `parameters`' for TGI and LMI `inputs`); a worker kind that cannot give it refuses (a 4xx).
OPTIONS: dict[str, list[dict[str, Any]]] = {
    "openai_chat": [{"logprobs": True, "top_logprobs": 2}, {"n": 2}, {"stop": [" the"]},
                    {"tools": TOOLS, "tool_choice": NAMED}, {"tools": TOOLS},
                    {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}],
    "openai_completions": [{"logprobs": 2}, {"n": 2}, {"echo": True}, {"stop": [" the"]},
                           {"stream_options": {"include_usage": True}}],
    "lmi_chat": [{"logprobs": True, "top_logprobs": 2}, {"n": 2},
                 {"tools": TOOLS, "tool_choice": NAMED}],
    "lmi_inputs": [{"details": True}, {"details": True, "top_n_tokens": 2},
                   {"decoder_input_details": True, "details": True}, {"stop": [" the"]}],
    "tgi": [{"details": True}, {"top_n_tokens": 2, "details": True},
            {"decoder_input_details": True, "details": True}, {"stop": [" the"]}],
    "elastic_chat": [{"tools": TOOLS, "tool_choice": NAMED}, {"stop": [" the"]}],
    "elastic_completion": [],
}
# a JSON event on its own line: SSE's `data:` (with or without its space) or a JSON line
EVENT = re.compile(rb"^(data: ?)?(\{.*\})$")
# what differs between two runs of the same case: ids, times, the gateway's request ids
VOLATILE = re.compile(rb'("(?:id|system_fingerprint)": ?)"[^"]*"|("created": ?)[0-9]+'
                      rb'|(?:chatcmpl|cmpl)-[0-9a-f]{6,}')


def fake_app(kind: str) -> Any:
    if kind in ("vllm", "openai"):
        return server.build_app(settings.SimulatorSettings(tokens=6))
    if kind == "triton-legacy":  # a 2024-era ensemble's outputs (tests/fakes/triton_fake.py)
        return triton_fake.app(shape="legacy")
    return {"trtllm": trtllm_fake.app, "triton": triton_fake.app, "tgi": tgi_fake.app}[kind]()


def spoil_value(node: Any, rng: random.Random) -> Any:
    """`node` with one value somewhere in it replaced by an odd one, or one key removed."""
    if isinstance(node, dict) and node and rng.random() < 0.75:
        key = rng.choice(list(node))
        if rng.random() < 0.15:
            return {k: v for k, v in node.items() if k != key}
        return {**node, key: spoil_value(node[key], rng)}
    if isinstance(node, list) and node and rng.random() < 0.75:
        i = rng.randrange(len(node))
        return [*node[:i], spoil_value(node[i], rng), *node[i + 1:]]
    return rng.choice(ODD)


# How a worker may frame the same events otherwise (the first five are still right: SSE's
# CRLF, comments, extra fields and BOM, and reads cut anywhere), or wrongly.
FRAMINGS = ("crlf", "comment", "fields", "bom", "cut reads", "cut short", "no end", "garbage",
            "twice")


def reframe(body: bytes, rng: random.Random, how: str | None = None) -> list[bytes]:
    """The worker's answer framed one odd way (`how`, else drawn), in parts cut at random
    bytes."""
    how = how or rng.choice(FRAMINGS)
    if how == "plain":  # as the worker framed it, in one read
        return [body]
    if how == "crlf":
        body = body.replace(b"\n", b"\r\n")
    elif how == "comment":
        body = body.replace(b"\n\n", b"\n\n: ping\n\n", rng.randint(1, 3))
    elif how == "fields":
        body = body.replace(b"data:", b"event: message\nid: 7\nretry: 10\ndata:", 2)
    elif how == "bom":
        body = b"\xef\xbb\xbf" + body
    elif how == "cut short":
        body = body[:rng.randrange(len(body) + 1)]
    elif how == "no end":
        body = body.rstrip(b"\n").rpartition(b"\n")[0]
    elif how == "garbage":
        at = body.find(b"\n\n") + 2 if b"\n\n" in body else len(body)
        body = body[:at] + rng.choice((b"data: {cut\n\n", b"{cut\n", b"\x00\xff\n\n",
                                       b"data: [DONE]\n\n", b"\n\n\n")) + body[at:]
    elif how == "twice":
        first = body.split(b"\n\n", 1)[0] + b"\n\n"
        body = first + body
    cuts = sorted(rng.sample(range(1, len(body)), max(0, min(len(body) - 1, rng.randint(0, 6)))))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def spoil(body: bytes, rng: random.Random) -> list[bytes]:
    """The worker's answer as the parts it is sent in (one an event), one or two of its JSON
    events spoiled (json.dumps: orjson cannot write 2**70), or framed oddly (a third)."""
    if rng.random() < 0.33:
        return reframe(body, rng)
    events = body.split(b"\n")
    found = [i for i, line in enumerate(events) if EVENT.match(line)]
    for i in rng.sample(found, min(len(found), rng.choice((1, 1, 2)))):
        match = EVENT.match(events[i])
        assert match is not None
        value = spoil_value(json.loads(match[2]), rng)
        events[i] = (match[1] or b"") + json.dumps(value, separators=(",", ":"),
                                                   ensure_ascii=False).encode()
    parts = b"\n".join(events).split(b"\n\n")
    return [p + b"\n\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


class OddWorker:
    """A loopback worker of one kind whose generation answers carry odd values (its health
    and info answers are the fake's own, so that the gateway routes to it)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.fake = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake_app(kind)),
                                      base_url="http://fake", timeout=20)
        self.rng = random.Random(0)
        self.framing: str | None = None  # each answer framed this way, right values
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in self.open:  # the gateway's pooled connections: their handlers end
            writer.close()
        await asyncio.sleep(0)
        await self.fake.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                method, target, _ = line.split(" ", 2)
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (f.partition(":") for f in fields if f)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                writer.write(await self._answer(method, target, headers, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open.discard(writer)
            writer.close()

    async def _answer(self, method: str, target: str, headers: dict[str, str],
                      body: bytes) -> bytes:
        r = await self.fake.request(method, target, content=body, headers={
            k: v for k, v in headers.items() if k in ("content-type", "accept")})
        status, ctype = r.status_code, r.headers.get("content-type", "application/json")
        parts = [r.content]
        if method == "POST" and status == 200:
            if self.framing is not None:
                parts = reframe(r.content, self.rng, self.framing)
            elif self.rng.random() < 0.2:  # refused or failed, with an odd error body
                status, ctype = self.rng.choice(ERROR_STATUSES), "application/json"
                parts = [self.rng.choice(NOT_JSON) if self.rng.random() < 0.2 else json.dumps(
                    spoil_value(ERRORS[self.kind], self.rng)).encode()]
            else:
                parts = spoil(r.content, self.rng)
        head = f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ntransfer-encoding: chunked\r\n\r\n"
        return head.encode() + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) \
            + b"0\r\n\r\n"


def gateway_config(kind: str, *urls: str) -> config.Config:
    kind = kind.removesuffix("-legacy")
    backend = harness.KINDS[kind][0]
    model: dict[str, Any] = {"name": "m", "backend": backend, "upstreams": list(urls),
                             "upstream_model": "ensemble" if kind == "triton" else "org/m"}
    if kind == "triton":
        model["chat_template"] = harness.TEMPLATE
    return config.Config.model_validate({"default_model": "m", "models": [model]})


@dataclass
class Outcome:
    """One case: what the client got."""

    case: int
    kind: str
    client: str
    stream: bool
    status: int
    body: bytes

    def line(self) -> str:
        seen = VOLATILE.sub(rb"\1\2_", self.body)
        return (f"{self.case} {self.kind} {self.client} {'stream' if self.stream else 'whole'} "
                f"{self.status} {seen!r}")


async def outcomes(seed: int, count: int, framing: str | None = None,
                   spare: bool = False) -> list[Outcome]:
    """`count` cases drawn from `seed`, spread over the worker kinds, in case order; with
    `framing`, every answer is right but framed that way; with `spare`, a second worker of
    the kind answers rightly beside the odd one (the gateway retries, fails over and
    continues streams on it)."""
    found: list[Outcome] = []
    for k, kind in enumerate(KINDS):
        worker, good = OddWorker(kind), OddWorker(kind)
        worker.framing, good.framing = framing, "plain"
        urls = [await worker.start()] + ([await good.start()] if spare else [])
        app = gateway_app.build_app(gateway_config(kind, *urls))
        try:
            async with app.router.lifespan_context(app), httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://gw",
                    timeout=30) as gw:
                for i in range(k, count, len(KINDS)):
                    rng = random.Random(f"{seed}/{i}")
                    client, stream = rng.choice(CASES)
                    worker.rng = rng
                    path, body = harness.CLIENTS[client][0](stream)
                    if OPTIONS[client] and rng.random() < 0.4:
                        asked = rng.choice(OPTIONS[client])
                        (body["parameters"] if "parameters" in body else body).update(asked)
                    r = await gw.post(path, content=json.dumps(body).encode(),
                                      headers={"content-type": "application/json"})
                    found.append(Outcome(i, kind, client, stream, r.status_code, r.content))
        finally:
            await worker.stop()
            await good.stop()
    return sorted(found, key=lambda o: o.case)


if __name__ == "__main__":
    observability.configure("critical")  # the lines are the output
    found = asyncio.run(outcomes(int(sys.argv[1]), int(sys.argv[2]), spare="spare" in sys.argv))
    print("\n".join(o.line() for o in found))
