"""JSON exactly as DJL's two writers print it: Python's `json.dumps` and Java's Gson.

LMI's Python handlers write `json.dumps(obj, ensure_ascii=False)` (output_formatter.py), so
their bytes have Python's default separators `", "` and `": "` and `repr` floats (`1e-07`),
which orjson cannot write. `dumps` reproduces them: strings go through orjson, whose escaping
equals `json.dumps(ensure_ascii=False)` byte for byte (a property test checks), and the rest is
assembled here. The Java front end writes its own bodies with Gson (`JsonUtils.GSON`): compact,
HTML-safe escaping; `/ping` uses `GSON_PRETTY` (two-space indent) plus a newline.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

_str = orjson.dumps
_INF = math.inf


def number(x: float | None) -> bytes:
    """A float as `json.dumps` writes it: float.__repr__, NaN / Infinity for non-finite."""
    if x is None:
        return b"null"
    if -_INF < x < _INF:
        return repr(x).encode()
    return b"NaN" if x != x else (b"Infinity" if x > 0 else b"-Infinity")


def dumps(obj: Any) -> bytes:
    """`json.dumps(obj, ensure_ascii=False).encode()` for JSON data (str keys)."""
    t = type(obj)
    if t is str:
        return _str(obj)
    if t is dict:
        return b"{" + b", ".join([_str(k) + b": " + dumps(v) for k, v in obj.items()]) + b"}"
    if t is list or t is tuple:
        return b"[" + b", ".join([dumps(v) for v in obj]) + b"]"
    if obj is None:
        return b"null"
    if obj is True:
        return b"true"
    if obj is False:
        return b"false"
    if t is int:
        return str(obj).encode()
    if t is float:
        return number(obj)
    raise TypeError(f"not JSON data: {t.__name__}")


# Gson's HtmlSafe escaping (com.google.gson.stream.JsonWriter HTML_SAFE_REPLACEMENT_CHARS),
# applied after orjson, whose control-character escapes Gson shares; Gson also escapes the two
# JavaScript line terminators.
_GSON_HTML = (
    (b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"), (b"=", b"\\u003d"),
    (b"'", b"\\u0027"), ("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029"),
)


def gson_string(s: str) -> bytes:
    out = _str(s)
    for raw, escaped in _GSON_HTML:
        if raw in out:
            out = out.replace(raw, escaped)
    return out


def gson_error(message: str, code: int) -> bytes:
    """Request.java addResponse: a `ConcurrentHashMap` of `code` and `error` written by Gson;
    its iteration puts `error` first (wire-formats.md 5.2): `{"error":"...","code":424}`."""
    return b'{"error":' + gson_string(message) + b',"code":' + str(code).encode() + b"}"


def gson_pretty_statuses(statuses: list[tuple[str, str]]) -> bytes:
    """`/ping`: GSON_PRETTY of a map model -> {"status": ...}, then "\\n"
    (NettyUtils.sendJsonResponse). Gson writes an empty map as `{}`."""
    if not statuses:
        return b"{}\n"
    entries = [b'  ' + gson_string(name) + b': {\n    "status": ' + gson_string(status)
               + b"\n  }" for name, status in statuses]
    return b"{\n" + b",\n".join(entries) + b"\n}\n"


def pretty_compact(obj: Any, indent: int = 0) -> bytes:
    """`Output._encode_json` of the dynamic-batch handler (outputs.py): `json.dumps(...,
    ensure_ascii=False, indent=2, separators=(",", ":"))`."""
    pad = b"\n" + b"  " * (indent + 1)
    end = b"\n" + b"  " * indent
    t = type(obj)
    if t is dict:
        if not obj:
            return b"{}"
        items = [_str(k) + b":" + pretty_compact(v, indent + 1) for k, v in obj.items()]
        return b"{" + pad + (b"," + pad).join(items) + end + b"}"
    if t is list:
        if not obj:
            return b"[]"
        return b"[" + pad + (b"," + pad).join(pretty_compact(v, indent + 1) for v in obj) \
            + end + b"]"
    return dumps(obj)
