"""Routing events (ejection, recovery, failover) as small functions, one place to count them.

Logged here; metrics record them through these same calls, so the routing code never names a
metric.
"""

from __future__ import annotations

from gateway import observability


def ejected(url: str, backoff: float) -> None:
    """An upstream left rotation after failing in a row (or failing its half-open trial)."""
    observability.logger().warning("upstream_ejected", upstream=url, backoff_s=round(backoff, 3))


def probe_changed(url: str, ok: bool) -> None:
    """An active probe found an upstream up or down (only changes are reported)."""
    log = observability.logger()
    (log.info if ok else log.warning)("upstream_probe", upstream=url, healthy=ok)


def failover(model: str, url: str, ok: bool, tokens_so_far: int) -> None:
    """A stream cut after its first byte was (ok) or could not be continued elsewhere."""
    observability.logger().warning("stream_failover", model=model, upstream=url,
                                   continued=ok, tokens_so_far=tokens_so_far)
