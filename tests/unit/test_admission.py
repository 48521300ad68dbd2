"""gateway.admission: `server.max_concurrent_requests` counted once over every serving process."""

from __future__ import annotations

from pathlib import Path

from gateway import admission


def test_one_process_counts_alone() -> None:
    one = admission.Admission(2)
    assert one.enter() and one.enter() and not one.enter()
    one.leave()
    assert one.enter() and one.count == 2


def test_processes_share_the_limit_and_a_dead_ones_places_come_back(tmp_path: Path) -> None:
    slots = admission.Slots(str(tmp_path), 2)
    a = admission.Admission(3, str(tmp_path), 0)
    b = admission.Admission(3, str(tmp_path), 1)
    assert a.enter() and a.enter() and b.enter()
    assert not a.enter() and not b.enter()  # 3 in flight over both: refused in either
    assert (a.count, b.count) == (2, 1)  # a refusal takes nothing
    b.leave()
    assert b.enter() and not a.enter()
    slots.clear(0)  # process 0 died with 2 admitted: the parent gives its places back
    assert b.enter() and b.enter() and not b.enter()
