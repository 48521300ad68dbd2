"""The one exception tree every layer raises and every client adapter renders.

    GatewayError (500)
    ├─ RequestError (4xx, the caller can fix it)
    │    ├─ InvalidRequest 400 (.field)
    │    │    └─ MalformedBody 400/415/422 (not JSON, not JSON's media type, not the shape)
    │    ├─ Unauthorized 401
    │    ├─ ModelNotFound 404
    │    ├─ NoRoute 404 (no route at the path)
    │    │    └─ MethodNotAllowed 405 (the route takes other methods)
    │    ├─ PayloadTooLarge 413
    │    ├─ Overloaded 429 (the gateway's own concurrency limit)
    │    └─ Unsupported 400 (the worker cannot do what was asked)
    ├─ UpstreamRejected (the worker's own 4xx status and message, passed on)
    └─ UpstreamError (5xx, the worker failed)
         ├─ UpstreamUnavailable 503 (before the first byte; retryable)
         ├─ UpstreamTimeout 504
         └─ UpstreamBroken 502 (failed, malformed or unfinished)
"""

from __future__ import annotations

from typing import Any

# A message quotes what it is about (a model name, a field, a path, a worker's own words): past
# this many characters its middle is cut, so that a client's 1 MB model name is echoed whole
# neither into its error body nor into the request's log line.
MAX_TEXT = 1024


def bounded(text: str, limit: int = MAX_TEXT) -> str:
    """`text`, or its first and last parts around ` ... ` when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


class GatewayError(Exception):
    """Base: carries the HTTP status a client protocol renders by default.

    `message` reaches the client; `detail` (a worker's address, an exception's class, a body
    that is not the worker's error message) reaches only the log line of the request."""

    status: int = 500
    kind: str = "internal_error"
    # The answer's Retry-After (RFC 9110 section 10.2.3): the gateway's own 429 (Overloaded),
    # or what the worker said with the 429 or 503 it passes on (gateway.pipeline).
    retry_after: int | str | None = None

    def __init__(self, message: str, *, field: str | None = None, status: int | None = None,
                 detail: str | None = None):
        message = bounded(message)
        super().__init__(message)
        self.message = message  # what the client reads: never an address, class name or body
        self.field = field
        # what only the request's log line gets (worker address, body)
        self.detail = detail if detail is None else bounded(detail)
        if status is not None:
            self.status = status


class RequestError(GatewayError):
    """The caller can fix it."""

    status = 400
    kind = "invalid_request"


class InvalidRequest(RequestError):
    """A field is missing, malformed or out of range; `field` names it."""


class MalformedBody(InvalidRequest):
    """The body could not be read as the route's JSON at all: a syntax error (400), a media
    type that is not JSON (415), or JSON of the wrong shape (422); as a JSON extractor such as
    axum's refuses it before the handler runs."""


class Unauthorized(RequestError):
    status = 401
    kind = "unauthorized"


class ModelNotFound(RequestError):
    status = 404
    kind = "model_not_found"


class NoRoute(RequestError):
    """No route takes the request's path: answered in the error body of the protocol whose
    routes share the path's first segment (`/v1/...`: OpenAI's), as the caller reads errors.
    `method`, `uri` (the path and its query) and `allowed` (a 405's methods) are there for
    the protocols whose own words name them."""

    status = 404
    kind = "not_found"

    def __init__(self, message: str, *, method: str = "", uri: str = "", allowed: str = "",
                 **kwargs: Any):
        super().__init__(message, **kwargs)
        self.method, self.uri, self.allowed = method, bounded(uri), allowed


class MethodNotAllowed(NoRoute):
    """The route at the path takes other methods (the answer carries `Allow`)."""

    status = 405
    kind = "method_not_allowed"


class PayloadTooLarge(RequestError):
    status = 413
    kind = "payload_too_large"


class Overloaded(RequestError):
    """The gateway is at `max_concurrent_requests`; the client should retry later."""

    status = 429
    kind = "overloaded"
    retry_after: int | str | None = 1


class Unsupported(RequestError):
    """The worker kind cannot do what the client asked (token ids, n>1, ...)."""

    kind = "unsupported"


class UpstreamRejected(GatewayError):
    """The worker refused the request (a 4xx of its own); its status and message pass on."""

    status = 400
    kind = "upstream_rejected"


class UpstreamError(GatewayError):
    """The worker failed."""

    status = 502
    kind = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    """No answer could be had before the first byte; another upstream may serve it."""

    status = 503
    kind = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    kind = "upstream_timeout"


class UpstreamBroken(UpstreamError):
    """The worker's answer failed, was malformed, or ended without its terminal event."""

    status = 502
    kind = "upstream_broken"


def all_error_classes() -> list[type[GatewayError]]:
    """Every class of the tree, for tests that walk all errors through all frontends."""
    found: list[type[GatewayError]] = []
    pending: list[type[GatewayError]] = [GatewayError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found
