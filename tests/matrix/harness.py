"""The client × worker matrix: one gateway app per worker kind, fakes of every worker in
process (httpx.ASGITransport, routed by host), and a checker per client protocol that says
whether an answer is right in that protocol's form or a refusal in its error form."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from gateway import app as gateway_app
from gateway import config, upstream, upstream_clients
from simulator import server, settings
from tests.fakes import tgi_fake, triton_fake, trtllm_fake

TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")

# worker kind -> (backend, upstream host); "simulator" is the vllm protocol over real loopback.
KINDS: dict[str, tuple[str, str]] = {
    "vllm": ("vllm", "http://vllm.fake"),
    "openai": ("openai", "http://openai.fake"),
    "trtllm": ("trtllm", "http://trtllm.fake"),
    "triton": ("triton", "http://triton.fake"),
    "tgi": ("tgi", "http://tgi.fake"),
    "simulator": ("vllm", ""),  # filled with a real process's URL
}


class Fakes(httpx.AsyncBaseTransport):
    """Routes each fake host to its in-process worker; other hosts go over the network."""

    def __init__(self) -> None:
        sim = server.build_app(settings.SimulatorSettings())
        self.apps: dict[str, httpx.ASGITransport] = {
            "vllm.fake": httpx.ASGITransport(app=sim),
            "openai.fake": httpx.ASGITransport(app=sim),
            "trtllm.fake": httpx.ASGITransport(app=trtllm_fake.app()),
            "triton.fake": httpx.ASGITransport(app=triton_fake.app()),
            "tgi.fake": httpx.ASGITransport(app=tgi_fake.app()),
        }
        self.real = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        fake = self.apps.get(request.url.host)
        return await (fake or self.real).handle_async_request(request)


def make_config(kind: str, sim_url: str, extra: dict[str, Any] | None = None) -> config.Config:
    """One model `m` on one worker kind; `extra`: more of its config keys (`tokenizer`)."""
    backend, url = KINDS[kind]
    model: dict[str, Any] = {"name": "m", "backend": backend, "upstreams": [url or sim_url],
                             "upstream_model": "ensemble" if kind == "triton" else "org/m",
                             **(extra or {})}
    if kind == "triton":
        model["chat_template"] = TEMPLATE
    return config.Config.model_validate({"default_model": "m", "models": [model]})


@dataclass
class Answer:
    status: int
    body: bytes
    media_type: str


async def post(kind: str, sim_url: str, path: str, body: dict[str, Any],
               extra: dict[str, Any] | None = None) -> Answer:
    fakes = Fakes()

    def factory(_: config.Config) -> upstream.UpstreamClient:
        return upstream_clients.HttpxClient(httpx.AsyncClient(transport=fakes, timeout=20))

    app = gateway_app.build_app(make_config(kind, sim_url, extra), factory)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw", timeout=30) as client:
            r = await client.post(path, content=orjson.dumps(body),
                                  headers={"content-type": "application/json"})
    return Answer(r.status_code, r.content, r.headers.get("content-type", ""))


def sse_data(body: bytes) -> list[bytes]:
    out = []
    for event in body.replace(b"\xef\xbb\xbf", b"").split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                out.append(line[5:].strip())
    return out


Checker = Callable[[Answer, bool], str]


def _refusal(a: Answer, shape: Callable[[Any], bool]) -> str:
    """A 4xx in the protocol's error shape is a documented refusal; anything else is wrong."""
    if 400 <= a.status < 500:
        try:
            obj = orjson.loads(a.body)
        except orjson.JSONDecodeError:
            events = sse_data(a.body)
            obj = orjson.loads(events[0]) if events else None
        if shape(obj):
            return f"refused {a.status}"
    return f"WRONG {a.status}: {a.body[:300]!r}"


def openai_chat(a: Answer, stream: bool) -> str:
    if a.status != 200:
        return _refusal(a, lambda o: set(o["error"]) == {"message", "type", "param", "code"})
    if not stream:
        return "ok" if orjson.loads(a.body)["choices"][0]["message"]["content"] else "WRONG empty"
    events = sse_data(a.body)
    if events[-1] != b"[DONE]" or any(b'"error"' in e for e in events):
        return f"WRONG stream {events[-2:]!r}"
    text = "".join(c["delta"].get("content") or "" for e in events[:-1]
                   for c in orjson.loads(e)["choices"])
    return "ok" if text else "WRONG empty"


def openai_completions(a: Answer, stream: bool) -> str:
    if a.status != 200:
        return _refusal(a, lambda o: set(o["error"]) == {"message", "type", "param", "code"})
    if not stream:
        return "ok" if orjson.loads(a.body)["choices"][0]["text"] else "WRONG empty"
    events = sse_data(a.body)
    if events[-1] != b"[DONE]" or any(b'"error"' in e for e in events):
        return f"WRONG stream {events[-2:]!r}"
    text = "".join(c["text"] for e in events[:-1] for c in orjson.loads(e)["choices"])
    return "ok" if text else "WRONG empty"


def _lmi_refusal(a: Answer) -> str:
    return _refusal(a, lambda o: isinstance(o, dict) and "error" in o and "code" in o)


def lmi_chat(a: Answer, stream: bool) -> str:
    if a.status != 200:
        return _lmi_refusal(a)
    if not stream:
        return "ok" if orjson.loads(a.body)["choices"][0]["message"]["content"] else "WRONG"
    lines = [orjson.loads(x) for x in a.body.splitlines() if x.strip()]
    if any(c.get("finish_reason") == "error" for ln in lines for c in ln.get("choices", [])):
        return f"WRONG error line {lines[-1]}"
    text = "".join(c["delta"].get("content") or "" for ln in lines for c in ln["choices"])
    return "ok" if text else "WRONG empty"


def lmi_inputs(a: Answer, stream: bool) -> str:
    if a.status != 200:
        return _lmi_refusal(a)
    if not stream:
        return "ok" if orjson.loads(a.body)["generated_text"] else "WRONG empty"
    lines = [orjson.loads(x) for x in a.body.splitlines() if x.strip()]
    last = lines[-1]
    if (last.get("details") or {}).get("finish_reason") == "error" or not last.get(
            "generated_text"):
        return f"WRONG last line {last}"
    return "ok"


def tgi(a: Answer, stream: bool) -> str:
    if a.status != 200:
        return _refusal(a, lambda o: set(o) == {"error", "error_type"})
    if not stream:
        return "ok" if orjson.loads(a.body)["generated_text"] else "WRONG empty"
    events = [orjson.loads(e) for e in sse_data(a.body)]
    if "error" in events[-1]:  # TGI: stream validation errors are events after HTTP 200
        return ("refused in-band 422" if events[-1]["error_type"] == "validation"
                else f"WRONG {events[-1]}")
    return "ok" if events[-1].get("generated_text") else f"WRONG {events[-1]}"


def elastic_chat(a: Answer, stream: bool) -> str:
    if a.status != 200:
        return _refusal(a, lambda o: "error" in o)
    events = sse_data(a.body)
    if events[-1] != b"[DONE]" or b"event: error" in a.body:
        return f"WRONG {a.body[-300:]!r}"
    chunks = [orjson.loads(e)["chat_completion"] for e in events[:-1]]
    text = "".join(c["delta"].get("content") or "" for k in chunks for c in k["choices"])
    return "ok" if text else "WRONG empty"


def elastic_completion(a: Answer, stream: bool) -> str:
    if a.status != 200:
        return _refusal(a, lambda o: "error" in o)
    if not stream:
        return "ok" if orjson.loads(a.body)["completion"][0]["result"] else "WRONG empty"
    events = sse_data(a.body)
    if events[-1] != b"[DONE]" or b"event: error" in a.body:
        return f"WRONG {a.body[-300:]!r}"
    text = "".join(d["delta"] for e in events[:-1] for d in orjson.loads(e)["completion"])
    return "ok" if text else "WRONG empty"


MSG = [{"role": "user", "content": "Say something"}]

# client protocol -> (path, body for stream flag, checker, streaming modes it has)
CLIENTS: dict[str, tuple[Callable[[bool], tuple[str, dict[str, Any]]], Checker, tuple[bool, ...]]] = {
    "openai_chat": (lambda s: ("/v1/chat/completions",
                               {"model": "m", "messages": MSG, "max_tokens": 5, "stream": s}),
                    openai_chat, (False, True)),
    "openai_completions": (lambda s: ("/v1/completions",
                                      {"model": "m", "prompt": "Say", "max_tokens": 5,
                                       "stream": s}), openai_completions, (False, True)),
    "lmi_chat": (lambda s: ("/predictions/m", {"messages": MSG, "max_tokens": 5, "stream": s}),
                 lmi_chat, (False, True)),
    "lmi_inputs": (lambda s: ("/predictions/m", {"inputs": "Say", "stream": s,
                                                 "parameters": {"max_new_tokens": 5}}),
                   lmi_inputs, (False, True)),
    "tgi": (lambda s: ("/generate_stream" if s else "/generate",
                       {"inputs": "Say", "parameters": {"max_new_tokens": 5}}),
            tgi, (False, True)),
    "elastic_chat": (lambda s: ("/_inference/chat_completion/m/_stream",
                                {"messages": MSG, "max_completion_tokens": 5}),
                     elastic_chat, (True,)),
    "elastic_completion": (lambda s: ("/_inference/completion/m" + ("/_stream" if s else ""),
                                      {"input": "Say"}), elastic_completion, (False, True)),
}


async def run_cell(client: str, kind: str, stream: bool, sim_url: str) -> str:
    make, check, _ = CLIENTS[client]
    path, body = make(stream)
    return check(await post(kind, sim_url, path, body), stream)


Runner = Callable[[str, str, bool, str], Awaitable[str]]
