"""Routing events (ejection, recovery, failover) as small functions: logged here and counted
by gateway.metrics, so the routing code names no metric. The app hands them to the balancer
(as its `Listener`) and the pipeline (`on_failover`): imported by neither, so no import circle
runs through the metrics and logs modules."""

from __future__ import annotations

from gateway import metrics, observability, upstream


def ejected(model: str, url: str, backoff: float) -> None:
    """An upstream left rotation after failing in a row (or failing its half-open trial)."""
    metrics.ejected(model, url)
    observability.logger().warning("upstream_ejected", model=model, upstream=upstream.shown(url),
                                   backoff_s=round(backoff, 3))


def restored(model: str, url: str) -> None:
    """An ejected upstream passed its half-open trial and is back in rotation."""
    metrics.restored(model, url)
    observability.logger().info("upstream_restored", model=model,
                                upstream=upstream.shown(url))


def probe_changed(model: str, url: str, ok: bool, why: str = "") -> None:
    """An active probe found an upstream up or down (only changes are reported); a down one
    says why (refused, a certificate not trusted, the health route's status)."""
    (metrics.restored if ok else metrics.ejected)(model, url)
    log = observability.logger()
    if ok:
        log.info("upstream_probe", model=model, upstream=upstream.shown(url), healthy=True)
    else:
        log.warning("upstream_probe", model=model, upstream=upstream.shown(url), healthy=False,
                    error=why)


def failover(request_id: str, model: str, failed: str, to: str | None,
             tokens_so_far: int) -> None:
    """A stream cut after its first byte was continued on `to` (None: it could not be); the
    line names its request, whose own line tells the rest."""
    if to is not None:
        metrics.failover(model, to)
    observability.logger().warning("stream_failover", request_id=request_id, model=model,
                                   upstream=upstream.shown(failed),
                                   continued=to is not None,
                                   to=to if to is None else upstream.shown(to),
                                   tokens_so_far=tokens_so_far)


class Events:
    """These functions as the balancer's `Listener`."""

    ejected = staticmethod(ejected)
    restored = staticmethod(restored)
    probe_changed = staticmethod(probe_changed)
