"""HTTP/1.1 on a raw socket for wire tests: the test writes the exact request bytes, and one
response at a time is read back (status line, headers, body by Content-Length, chunked or until
close; RFC 9112 section 6.3), every recv bounded by the socket's timeout. Also the gateway those
tests start: one model served by the managed simulator, with small body and read limits."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration import procs

TIMEOUT = 5.0  # seconds, for every connect and recv
MODEL = "demo"
MAX_BODY = 65536  # server.max_request_bytes
REQUEST_READ = 1  # server.timeouts.request_read, seconds
CHAT = "/v1/chat/completions"


@dataclass
class Response:
    version: str
    status: int
    headers: list[tuple[str, str]]  # names lower-cased, in wire order
    body: bytes = b""
    framing: str = "none"  # length | chunked | close | none (HEAD, 1xx, 204, 304)
    chunks: list[bytes] = field(default_factory=list)  # chunk data, the final 0-chunk excluded

    def header(self, name: str) -> str | None:
        values = self.all(name)
        return values[0] if values else None

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name.lower()]


class Conn:
    """One client connection with a read buffer; `response()` parses the next response."""

    def __init__(self, addr: tuple[str, int], timeout: float = TIMEOUT):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.buf = b""

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        """One recv into the buffer; False at end of stream (a reset counts as the end)."""
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        self.buf += data
        return bool(data)

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            if not self._fill():
                raise EOFError(f"connection closed before {marker!r}; had {self.buf[:200]!r}")
        out, self.buf = self.buf.split(marker, 1)
        return out

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError(f"connection closed with {len(self.buf)} of {n} bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def head(self) -> Response:
        """The next status line and headers, nothing of the body."""
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        version, status, *_ = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            assert sep and name == name.strip(), f"malformed header line {line!r}"
            headers.append((name.lower(), value.strip()))
        return Response(version, int(status), headers)

    def response(self, method: str = "POST") -> Response:
        """The next whole response; its body framed as RFC 9112 section 6.3 says."""
        resp = self.head()
        if method == "HEAD" or resp.status < 200 or resp.status in (204, 304):
            return resp
        te = resp.header("transfer-encoding")
        if te is not None:
            assert te.lower() == "chunked", te
            resp.framing = "chunked"
            resp.chunks = self.chunks_to_end()
            resp.body = b"".join(resp.chunks)
        elif (length := resp.header("content-length")) is not None:
            resp.framing, resp.body = "length", self._exactly(int(length))
        else:
            resp.framing = "close"
            while self._fill():
                pass
            resp.body, self.buf = self.buf, b""
        return resp

    def chunks_to_end(self) -> list[bytes]:
        """The data of the chunks still to come in a chunked body, up to its 0-length last
        chunk (consumed, not returned)."""
        chunks = []
        while True:
            size = int(self._until(b"\r\n").split(b";")[0], 16)
            data = self._exactly(size + 2)
            assert data.endswith(b"\r\n"), f"chunk not followed by CRLF: {data[-10:]!r}"
            if size == 0:
                return chunks  # no trailers are sent by the gateway: the 0-chunk ends with CRLF
            chunks.append(data[:-2])

    def first_chunk(self) -> bytes:
        """After `head()` of a chunked response: the first chunk's data."""
        size = int(self._until(b"\r\n").split(b";")[0], 16)
        return self._exactly(size + 2)[:-2]

    def closed_by_peer(self, within: float = TIMEOUT) -> bool:
        """True when the server closes (EOF or reset) with nothing more sent within `within`
        seconds; False when it stays open; AssertionError if bytes arrive."""
        self.sock.settimeout(within)
        try:
            more = self._fill()
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(TIMEOUT)
        assert not more, f"unexpected bytes: {self.buf[:200]!r}"
        return True

    def closes_within(self, within: float) -> bool:
        """True when the server closes within `within` seconds, whatever it sends before the
        close (kept in `buf`); False when it is still open then."""
        deadline = time.monotonic() + within
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                if not self._fill():
                    return True
            return False
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(TIMEOUT)


def request(method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None,
            version: str = "HTTP/1.1") -> bytes:
    """Request bytes: Host, and Content-Length for a body unless `headers` frame it otherwise."""
    hdrs = {"Host": "gateway.test"}
    if body and "Transfer-Encoding" not in (headers or {}):
        hdrs["Content-Length"] = str(len(body))
    hdrs.update(headers or {})
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
    return head.encode("latin-1") + b"\r\n" + body


def chunked(*parts: bytes) -> bytes:
    """A chunked body: each part a chunk, then the last chunk and no trailers."""
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@dataclass
class Gateway:
    """A `gateway serve` process for wire tests: its address and its JSON log file."""

    proc: procs.Proc
    addr: tuple[str, int]

    def log_records(self) -> list[dict[str, Any]]:
        out = []
        for line in Path(self.proc.log).read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # the line being written now, or a child's plain text
                continue
        return out

    def requests_logged(self) -> int:
        """The request lines logged so far, once no more are arriving: a request's line is
        written just after its answer, so one answered a moment ago may still be on its way."""
        count = -1
        for _ in range(20):
            now = sum(1 for r in self.log_records() if r.get("event") == "request")
            if now == count:
                return now
            count = now
            time.sleep(0.15)
        return count


# The simulator as the managed worker of the one model; small limits, so tests reach them fast.
CONFIG = f"""
server: {{max_request_bytes: {MAX_BODY}, timeouts: {{request_read: {REQUEST_READ}KEEP_ALIVE}}}}
default_model: {MODEL}
models:
  - {{name: {MODEL}, backend: vllm}}
workers:
  - {{kind: simulator, model: {MODEL}}}
"""


def start(tmp: Path, keep_alive: float | None = None) -> Gateway:
    """The gateway and its simulator; `keep_alive`: `timeouts.keep_alive` (else the default)."""
    extra = "" if keep_alive is None else f", keep_alive: {keep_alive:g}"
    proc, url = procs.gateway(tmp, CONFIG.replace("KEEP_ALIVE", extra))
    host, port = url.removeprefix("http://").split(":")
    return Gateway(proc, (host, int(port)))


def chat(stream: bool = False, content: str = "hi", max_tokens: int = 4) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": content}],
                            "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()
