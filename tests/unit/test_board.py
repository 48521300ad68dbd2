"""Serving processes share their upstreams' standing (gateway.board): what one process decides
of an upstream (an ejection, a restoration, a probe's verdict), the others take on, so /health
and the health gauge agree whichever process answers. Envoy keeps one outlier-detection state
for all its worker threads in the same way (envoyproxy/envoy
source/common/upstream/outlier_detection_impl.cc, run on the main thread)."""

from __future__ import annotations

from pathlib import Path

from gateway import balancer, board, config


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


URLS = ("http://10.0.0.1:8000", "http://10.0.0.2:8000")


def process(directory: Path, wall: Clock, monotonic: float) -> tuple[balancer.Upstreams, Clock]:
    """One serving process's view, with its own monotonic clock and the shared wall clock."""
    clock = Clock(monotonic)
    cfg = config.HealthConfig(eject_after=2, backoff=4.0, backoff_max=30)
    ups = balancer.Upstreams(URLS, "round_robin", cfg, clock, model="m")
    ups.board = board.Board(str(directory))
    ups.wall = wall
    return ups, clock


def test_an_ejection_in_one_process_is_seen_by_the_other(tmp_path: Path) -> None:
    wall = Clock(1_000.0)
    a, clock_a = process(tmp_path, wall, 50.0)
    b, clock_b = process(tmp_path, wall, 7_000.0)
    for ups in (a, b):
        for url in URLS:
            ups.probed(url, True)
    bad = URLS[0]
    a.failed(bad)
    assert a.failed(bad) is True  # ejected in process a, for 4 s
    assert b.in_rotation() == [URLS[1]]  # b answers /health as a does
    assert b.in_service() == [URLS[1]]  # and the gauge
    b.sync()
    assert b.healthy() == [URLS[1]]  # and routes around it
    for clock in (wall, clock_a, clock_b):
        clock.now += 4.0  # the backoff is over: half-open in both
    assert a.in_rotation() == b.in_rotation() == list(URLS)
    ticket = b.begin(bad)  # b's half-open trial succeeds: restored in both
    b.succeeded(bad, ticket)
    b.end(bad, ticket)
    assert a.in_service() == b.in_service() == list(URLS)
    assert a.in_rotation() == list(URLS)


def test_a_probe_verdict_is_shared_and_the_newest_standing_wins(tmp_path: Path) -> None:
    wall = Clock(1_000.0)
    a, _ = process(tmp_path, wall, 50.0)
    b, _ = process(tmp_path, wall, 7_000.0)
    for ups in (a, b):
        for url in URLS:
            ups.probed(url, True)
    wall.now += 1
    a.probed(URLS[1], False)  # a's probe finds it down first
    assert b.in_rotation() == [URLS[0]]
    wall.now += 1
    b.probed(URLS[1], True)  # then b's finds it up again: newer
    assert a.in_rotation() == list(URLS)


def test_without_a_board_nothing_is_shared(tmp_path: Path) -> None:
    wall = Clock(1_000.0)
    a, _ = process(tmp_path, wall, 50.0)
    b, _ = process(tmp_path, wall, 50.0)
    b.board = None
    for ups in (a, b):
        for url in URLS:
            ups.probed(url, True)
    a.probed(URLS[0], False)
    assert b.in_rotation() == list(URLS)


def test_pods_gone_from_dns_leave_nothing_behind(tmp_path: Path) -> None:
    """A headless Service's pods come and go for weeks (rolling updates, autoscaling), each
    with a new address: what the board holds of an address no longer listed (its file, each
    process's last read of it) is dropped, so it stays bounded by the addresses listed now,
    not by every address ever seen. Kubernetes reuses a freed pod IP for a new pod: a stale
    file would also hand the new pod the old one's ejection. Envoy likewise drops a host's
    outlier-detection state when the host leaves its cluster (envoyproxy/envoy
    source/common/upstream/outlier_detection_impl.cc, DetectorImpl::initialize: its
    member-update callback erases each removed host's monitor from `host_monitors_`)."""
    wall = Clock(1_000.0)
    name = "http://workers.ns.svc:8000"
    procs = []
    for start in (50.0, 7_000.0):
        ups = balancer.Upstreams((name,), "round_robin", config.HealthConfig(), Clock(start),
                                 model="m")
        ups.board = board.Board(str(tmp_path))
        ups.wall = wall
        procs.append(ups)
    for pod in range(300):  # two pods at a time, one replaced per step
        addresses = [f"http://10.1.{pod // 250}.{pod % 250}:8000",
                     f"http://10.2.{(pod + 1) // 250}.{(pod + 1) % 250}:8000"]
        for ups in procs:
            ups.resolved(name, addresses)
            for url in addresses:
                ups.probed(url, True)  # a probe's first verdict is published
            ups.sync()
    for ups in procs:
        assert ups.board is not None
        assert len(ups.board._seen) <= 2  # noqa: SLF001
    assert len(list(tmp_path.iterdir())) <= 2
