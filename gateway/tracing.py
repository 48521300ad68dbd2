"""OpenTelemetry tracing, optional: the `otel` extra installs it, and the gateway runs without.

Enabled by `server.tracing: on`, or by `auto` (the default) when the standard variables ask
for an exporter: `OTEL_TRACES_EXPORTER` (other than `none`), `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true` turns it off. The exporter is
OTLP over HTTP/protobuf (or `console`), configured by the SDK's own `OTEL_*` variables
(endpoint, headers, timeout, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`).

Whether or not it is enabled, a client's W3C `traceparent` / `tracestate` reach the worker
(gateway.telemetry); with it enabled, they name the gateway's attempt span as the parent.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway import observability

SERVICE_NAME = "inference-gateway"
_OTLP_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def wanted(mode: str, environ: Mapping[str, str]) -> bool:
    """Whether `server.tracing` (`on` | `off` | `auto`) and the environment ask for spans."""
    if mode != "auto":
        return mode == "on"
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return any(environ.get(name) for name in _OTLP_VARS)


def from_env(mode: str, environ: Mapping[str, str]) -> Tracing | None:
    """Tracing that exports as the environment says, or None (off, or no opentelemetry)."""
    if not wanted(mode, environ):
        return None
    try:
        from opentelemetry.sdk import resources
        from opentelemetry.sdk.trace import TracerProvider, export
    except ImportError:
        observability.logger().warning(
            "tracing_unavailable",
            reason="opentelemetry is not installed: pip install 'inference-gateway[otel]'")
        return None
    exporter_name = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    exporter: Any
    if exporter_name == "console":
        # One JSON line per span (the SDK's default indents), like every other output line.
        exporter = export.ConsoleSpanExporter(
            out=sys.stdout, formatter=lambda span: span.to_json(None) + "\n")
    else:
        if exporter_name != "otlp":
            observability.logger().warning("tracing_exporter_unknown", exporter=exporter_name,
                                           using="otlp")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* itself
    # Resource.create merges OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES over this default.
    provider = TracerProvider(resource=resources.Resource.create(
        {"service.name": environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME}))
    provider.add_span_processor(export.BatchSpanProcessor(exporter))
    observability.logger().info("tracing_enabled", exporter=exporter_name)
    return Tracing.of(provider)


@dataclass(frozen=True, slots=True)
class Tracing:
    """The gateway's tracer and the provider that exports its spans."""

    provider: Any  # opentelemetry.sdk.trace.TracerProvider (tests: an in-memory exporter)
    tracer: Any

    @classmethod
    def of(cls, provider: Any) -> Tracing:
        return cls(provider, provider.get_tracer("gateway"))

    def shutdown(self) -> None:
        """Export the spans still batched (on stop)."""
        self.provider.shutdown()
