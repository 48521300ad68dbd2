"""`server.workers: auto` counts the CPUs a pod may use: its cgroup's CPU quota caps the
affinity mask (a pod with `limits.cpu: 2` on a 64-core node runs 2 serving processes)."""

from __future__ import annotations

import os
from pathlib import Path

from gateway import processes


def test_a_number_is_taken_as_given(tmp_path: Path) -> None:
    assert processes.count(3, str(tmp_path)) == 3


def test_cgroup_v2_quota_caps_auto(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # limits.cpu: 1500m
    assert processes.cgroup_cpus(str(tmp_path)) == 2
    assert processes.count("auto", str(tmp_path)) == min(2, len(os.sched_getaffinity(0)))


def test_cgroup_v2_without_quota_is_the_affinity_mask(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert processes.cgroup_cpus(str(tmp_path)) is None
    assert processes.count("auto", str(tmp_path)) == len(os.sched_getaffinity(0))


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")  # half a CPU: one process
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert processes.cgroup_cpus(str(tmp_path)) == 1
    assert processes.count("auto", str(tmp_path)) == 1


def test_cgroup_v1_unlimited_and_unreadable(tmp_path: Path) -> None:
    assert processes.cgroup_cpus(str(tmp_path)) is None  # nothing there
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert processes.cgroup_cpus(str(tmp_path)) is None
    assert processes.count("auto", str(tmp_path)) >= 1
