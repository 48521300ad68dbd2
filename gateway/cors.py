"""Browsers as clients: CORS answers as Starlette's CORSMiddleware gives them.

vLLM's API server wraps its whole app in that middleware (vllm/entrypoints/openai/api_server.py
build_app, origins, methods and headers "*" by default; TGI's router/src/server.rs wraps every
route in a tower-http CorsLayer, any origin by default), so a chat page in a browser calls either
directly. `server.cors` (gateway.config.CorsConfig) takes the middleware's own settings.

Every route, /metrics and the 404/405 answers included, as the middleware sees every answer of
the app it wraps. A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is
answered here, before any route: it needs no API key (browsers send none on it) and takes no
place among `max_concurrent_requests`. An `OPTIONS` that is no preflight reaches the routes as
before (405 with `Allow`). Other answers get the header lines `Policy.preflight_of` picks for
them: `Policy.simple` (a request with `Origin`) or `Policy.vary` (one without), made once here
(one dict lookup per request from a client that sends no Origin, as every SDK).

On the gateway's own server this module answers (gateway.http_server); on the ASGI path
(gateway.app.FastPaths, any ASGI server) Starlette's middleware itself does, with the same
settings; tests/unit/test_cors.py holds this module to that middleware's answers.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from starlette.middleware import cors as starlette_cors

from gateway import config, exchange, observability
from gateway.http_cycle import Cycle, new_id

# What the preflight answer varies by (Starlette's CORSMiddleware, preflight_headers).
_PREFLIGHT_VARY = ("Origin, Access-Control-Request-Method, Access-Control-Request-Headers, "
                   "Access-Control-Request-Private-Network")


def _line(name: str, value: str) -> bytes:
    return f"{name}: {value}\r\n".encode("latin-1")


class Policy:
    """`server.cors`, turned into the header lines each kind of answer carries."""

    def __init__(self, cfg: config.CorsConfig):
        self.any_origin = "*" in cfg.allow_origins
        self.origins = frozenset(cfg.allow_origins)
        self.regex = re.compile(cfg.allow_origin_regex) if cfg.allow_origin_regex else None
        self.credentials = cfg.allow_credentials
        self.private_network = cfg.allow_private_network
        self.methods = starlette_cors.ALL_METHODS if "*" in cfg.allow_methods \
            else cfg.allow_methods
        self.any_header = "*" in cfg.allow_headers
        listed = sorted(starlette_cors.SAFELISTED_HEADERS | set(cfg.allow_headers))
        self.header_names = frozenset(h.lower() for h in listed)
        # the origin is named (not "*") when only some are allowed, or with credentials: a
        # browser refuses "*" on a credentialed request (Fetch standard, CORS check)
        self.echo_origin = not self.any_origin or self.credentials
        self.vary = _line("vary", "Origin")  # every answer depends on the request's Origin
        shared = b""  # what an answer to any request with an Origin carries
        if self.credentials:
            shared += _line("access-control-allow-credentials", "true")
        if cfg.expose_headers:
            shared += _line("access-control-expose-headers", ", ".join(cfg.expose_headers))
        self._shared = shared + self.vary
        self._star = _line("access-control-allow-origin", "*") + self._shared
        preflight = [("vary", _PREFLIGHT_VARY)]
        if not self.echo_origin:
            preflight.append(("access-control-allow-origin", "*"))
        preflight += [("access-control-allow-methods", ", ".join(self.methods)),
                      ("access-control-max-age", str(cfg.max_age))]
        if not self.any_header:
            preflight.append(("access-control-allow-headers", ", ".join(listed)))
        if self.credentials:
            preflight.append(("access-control-allow-credentials", "true"))
        self._preflight = preflight

    def allowed(self, origin: str) -> bool:
        return self.any_origin or origin in self.origins or (
            self.regex is not None and self.regex.fullmatch(origin) is not None)

    def simple(self, origin: str) -> bytes:
        """The header lines of an answer (not a preflight's) to a request from `origin`."""
        if not self.echo_origin:
            return self._star
        if self.allowed(origin):
            return _line("access-control-allow-origin", origin) + self._shared
        return self._shared  # no allow-origin: the browser keeps the answer from the page

    def preflight_of(self, cycle: Cycle) -> bool:
        """True for a preflight; else the CORS lines of `cycle`'s answer are set (for a
        client that sends no Origin, as every non-browser client: one dict lookup)."""
        origin = cycle.headers.get("origin")
        if origin is None:
            cycle.cors_head = self.vary
            return False
        if cycle.method == "OPTIONS" and "access-control-request-method" in cycle.headers:
            return True
        cycle.cors_head = self.simple(origin)
        return False

    def preflight(self, headers: Mapping[str, str]) -> tuple[int, list[tuple[str, str]], bytes]:
        """The answer to a preflight: 200 `OK`, else 400 naming what is refused (a browser
        reads only the headers; the text is for whoever debugs it)."""
        out = dict(self._preflight)
        failures = []
        origin = headers["origin"]
        if not self.allowed(origin):
            failures.append("origin")
        elif self.echo_origin:
            out["access-control-allow-origin"] = origin
        if headers["access-control-request-method"] not in self.methods:
            failures.append("method")
        asked = headers.get("access-control-request-headers")
        if asked is not None:
            if self.any_header:  # "*" allows what was asked, named back
                out["access-control-allow-headers"] = asked
            elif any(h.strip() not in self.header_names for h in asked.lower().split(",")):
                failures.append("headers")
        if headers.get("access-control-request-private-network") is not None:
            if self.private_network:
                out["access-control-allow-private-network"] = "true"
            else:
                failures.append("private-network")
        if failures:
            return 400, list(out.items()), ("Disallowed CORS " + ", ".join(failures)).encode()
        return 200, list(out.items()), b"OK"


def policy(cfg: config.CorsConfig) -> Policy | None:
    """The policy for `server.cors`; None when it allows no origin (CORS off)."""
    return Policy(cfg) if cfg.enabled else None


async def answer_preflight(p: Policy, cycle: Cycle) -> None:
    """A preflight's answer, with the `x-request-id` and the log line every answer has
    (SPEC.md); no route, key or admission is involved, and no request metrics count it."""
    rid = cycle.headers.get("x-request-id") or new_id()
    x = exchange.Exchange(rid, cycle.path, time.perf_counter())
    status, fields, body = p.preflight(cycle.headers)
    x.status = status
    if status != 200:
        x.outcome, x.error_type, x.error = "client_error", "CorsRefused", body.decode()
    head = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in fields]
    head += [(b"content-type", b"text/plain; charset=utf-8"),
             (b"x-request-id", rid.encode("latin-1"))]
    try:
        await cycle.send({"type": "http.response.start", "status": status, "headers": head})
        cycle.write_body(body, more=False)
    finally:
        observability.log_exchange(x)
