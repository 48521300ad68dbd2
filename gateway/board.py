"""Upstream standings shared by the serving processes of one gateway (`server.workers: N`).

Each serving process routes with its own `balancer.Upstreams`, so without this an upstream
that one process ejected (its requests failed there) stayed in rotation in the others: /health
answered 200 or 503 by which process the kernel handed the connection to, and the health gauge
by which process wrote it last. As Envoy keeps one outlier-detection state for all its worker
threads, the processes share one here: a process whose view of an upstream changes (ejected,
restored, its probe's verdict) writes that standing to a small file in a directory the parent
made; the others read it when they answer /health or /metrics, and every fraction of a second
for routing (`health.watch`). The newest standing wins. Changes are rare (an ejection, a
probe's verdict flipping), so a file per upstream, replaced whole, is all it takes: no lock,
and nothing on the request path.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from hashlib import blake2b

import orjson

SYNC_SECONDS = 0.25  # how stale a process's routing view of the others' verdicts may be


@dataclass(slots=True, frozen=True)
class Standing:
    """One upstream as the process that last changed it sees it; times are wall clock."""

    at: float  # when it changed
    until: float  # ejected until then; 0: in rotation
    backoff: float  # the length of its last ejection
    probe_ok: bool | None  # its active probe's verdict; None: not probed yet


class Board:
    """The shared directory: one file per (model, upstream), replaced atomically."""

    def __init__(self, directory: str):
        self.directory = directory
        self._seen: dict[str, tuple[int, int, Standing | None]] = {}  # path -> stat, standing

    def _path(self, model: str, url: str) -> str:
        name = blake2b(f"{model}\n{url}".encode(), digest_size=16).hexdigest()
        return os.path.join(self.directory, name)

    def publish(self, model: str, url: str, standing: Standing) -> None:
        """Write `standing` for all processes; a write that fails (disk full) is skipped:
        each process still routes on its own view."""
        body = orjson.dumps({"at": standing.at, "until": standing.until,
                             "backoff": standing.backoff, "probe_ok": standing.probe_ok})
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".")
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
            os.replace(tmp, self._path(model, url))
        except OSError:
            return

    def set_running(self, model: str, url: str, running: bool) -> None:
        """The parent process runs the managed worker at `url` (started, not yet exited),
        or no longer does: a serving process takes the URL in only while it does, since
        another server may answer there (a port already in use)."""
        flag = self._path(model, url) + ".running"
        try:
            if running:
                with open(flag, "wb"):
                    pass
            else:
                os.unlink(flag)
        except OSError:
            return

    def forget(self, model: str, url: str, shared: bool) -> None:
        """`url` is no longer listed: its last read goes, and with `shared` its file too (an
        address gone from DNS, which every process drops; a managed worker's file stays, for
        the others to read its last standing). Else pods replaced for weeks pile up here, and
        a new pod on a freed address would take on the old one's standing."""
        path = self._path(model, url)
        self._seen.pop(path, None)
        if shared:
            try:
                os.unlink(path)
            except OSError:
                return

    def running(self, model: str, url: str) -> bool:
        return os.path.exists(self._path(model, url) + ".running")

    def read(self, model: str, url: str) -> Standing | None:
        """The latest standing written for the upstream, or None; read again only when its
        file changed."""
        path = self._path(model, url)
        try:
            st = os.stat(path)
        except OSError:
            return None
        seen = self._seen.get(path)
        if seen is not None and seen[:2] == (st.st_mtime_ns, st.st_ino):
            return seen[2]
        try:
            with open(path, "rb") as f:
                raw = orjson.loads(f.read())
            standing: Standing | None = Standing(float(raw["at"]), float(raw["until"]),
                                                 float(raw["backoff"]), raw["probe_ok"])
        except (OSError, ValueError, KeyError, TypeError):
            standing = None
        self._seen[path] = (st.st_mtime_ns, st.st_ino, standing)
        return standing
