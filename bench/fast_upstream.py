"""A static vLLM-shaped upstream for bench/bench.py, so that the benchmark shows the proxy's
limit rather than its worker's: nginx's own benchmarks proxy to a static upstream likewise.

    python bench/fast_upstream.py --port P [--tokens 32] [--itl-ms 0] [--ttft-ms 0]

A raw asyncio Protocol parsed by httptools on uvloop. The answers are the simulator's own
bytes for `POST /v1/chat/completions` (taken once at start-up by calling its ASGI app in this
process, so their shape is exactly what the simulator, and vLLM, send), framed in advance
(status line, headers, HTTP/1.1 chunks): per request only the choice between a stream and a
whole answer is made (from the body's `"stream": true`), and a stream's parts are written one
per event-loop turn (`--itl-ms 0`) or at fixed times after the request (`first + k * itl`,
as the simulator paces). `GET /health` answers 200. Not a test and not a product feature.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Callable
from typing import Any

import httptools
import uvloop

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "Say something."}]}


async def simulator_answer(tokens: int, stream: bool) -> tuple[bytes, list[bytes]]:
    """(content-type, body parts as sent) of the simulator's answer, called in process."""
    from simulator import SimulatorSettings, build_app

    app = build_app(SimulatorSettings(tokens=tokens, ttft_ms=0, itl_ms=0))
    body: dict[str, Any] = {**CHAT, "max_tokens": tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    inbox = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop()
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(b"content-type", b"application/json")], "query_string": b"",
             "http_version": "1.1"}
    await app(scope, receive, send)
    ctype = dict(sent[0]["headers"])[b"content-type"]
    return ctype, [m["body"] for m in sent[1:] if m.get("body")]


def chunked(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (RFC 9112 section 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class Answers:
    """Every byte this upstream writes, framed once."""

    def __init__(self, stream: tuple[bytes, list[bytes]], whole: tuple[bytes, list[bytes]]):
        head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\n"
        parts = [chunked(p) for p in stream[1]]
        parts[-1] += b"0\r\n\r\n"
        parts[0] = (head % stream[0]) + b"transfer-encoding: chunked\r\n\r\n" + parts[0]
        self.stream_parts = parts
        body = b"".join(whole[1])
        self.whole = (head % whole[0]) + b"content-length: %d\r\n\r\n%s" % (len(body), body)
        self.health = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class Conn(asyncio.Protocol):
    """One client connection: keep-alive, one request at a time."""

    def __init__(self, answers: Answers, itl: float, ttft: float):
        self.answers = answers
        self.itl = itl
        self.ttft = ttft
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []
        self.url = b""
        self.timer: asyncio.Handle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.body = []
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.transport is None:
            return
        if self.parser.get_method() == b"GET":
            self.transport.write(self.answers.health)
            return
        body = b"".join(self.body)
        if b'"stream":true' in body or b'"stream": true' in body:
            first = self.loop.time() + self.ttft
            if self.ttft:
                self.timer = self.loop.call_at(first, self._send_part, 0, first)
            else:
                self._send_part(0, first)
        elif self.ttft or self.itl:  # the simulator's whole answer: ttft + itl per further token
            delay = self.ttft + self.itl * (len(self.answers.stream_parts) - 2)
            self.timer = self.loop.call_later(delay, self._write, self.answers.whole)
        else:
            self.transport.write(self.answers.whole)

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _send_part(self, k: int, first: float) -> None:
        """Part k (token k+1) now; the next on the next loop turn or at its paced time; the
        last (usage and `[DONE]`) right after the last token, as the simulator sends it."""
        parts = self.answers.stream_parts
        if self.transport is None:
            return
        self.transport.write(parts[k])
        if k + 2 == len(parts):
            self.transport.write(parts[k + 1])
            self.timer = None
        elif self.itl:
            self.timer = self.loop.call_at(first + (k + 1) * self.itl, self._send_part, k + 1,
                                           first)
        else:
            self.timer = self.loop.call_soon(self._send_part, k + 1, first)


async def main_async(args: argparse.Namespace) -> None:
    answers = Answers(await simulator_answer(args.tokens, True),
                      await simulator_answer(args.tokens, False))
    itl, ttft = args.itl_ms / 1000, args.ttft_ms / 1000
    await serve_until_stopped(lambda: Conn(answers, itl, ttft), args.host, args.port)


async def serve_until_stopped(factory: Callable[[], asyncio.Protocol], host: str,
                              port: int) -> None:
    """Listen with `factory`'s protocol until SIGTERM or SIGINT (bench/python_floor.py too)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--itl-ms", type=float, default=0.0)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    uvloop.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
