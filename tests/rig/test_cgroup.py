"""CPU throttling with a cgroup: a busy loop in a 0.25-CPU cgroup gets about a quarter of a CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from splitrt.errors import RigError
from splitrt.rig import cgroup, netns

root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: writes cgroups")
PID = os.getpid()


def test_names_get_the_prefix_and_are_checked() -> None:
    assert cgroup.cgroup_name("dev1") == "spl-dev1"
    assert cgroup.cgroup_name("spl-dev1") == "spl-dev1"
    with pytest.raises(RigError):
        cgroup.cgroup_name("a/b")
    with pytest.raises(RigError, match="not open"):
        cgroup.CpuThrottle("x", 0.5).add_pid(1)


def _cpu_share(proc: psutil.Process, wall_s: float) -> float:
    c0 = sum(proc.cpu_times()[:2])
    t0 = time.monotonic()
    time.sleep(wall_s)
    return (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0)


@root
@pytest.mark.root
def test_busy_loop_is_throttled_then_released_and_cgroup_removed() -> None:
    name = f"spl-tc{PID}"
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        proc = psutil.Process(child.pid)
        with cgroup.CpuThrottle(name, 0.25) as cg:
            assert cg.hierarchy is not None and cg.path is not None
            assert cg.path.name == name and cg.path.is_dir()
            assert netns.owner_alive(name)
            cg.add_pid(child.pid)
            assert cg.pids() == [child.pid]
            if cg.hierarchy.version == 1:
                assert (cg.path / "cpu.cfs_quota_us").read_text().strip() == "25000"
                assert (cg.path / "cpu.cfs_period_us").read_text().strip() == "100000"
            else:
                assert (cg.path / "cpu.max").read_text().split() == ["25000", "100000"]
            # Upper bounds only: the quota caps a busy loop, but on a loaded host the loop may get less
            # than its quota (seen: 0.31 of a 0.5 quota at load 15), which says nothing about the cgroup.
            share = _cpu_share(proc, 1.5)
            assert 0.0 < share < 0.35, share
            cg.set_fraction(0.5)
            assert (cg.path / ("cpu.cfs_quota_us" if cg.hierarchy.version == 1 else "cpu.max")).read_text().split()[
                0
            ] == "50000"
            share = _cpu_share(proc, 1.5)
            assert 0.0 < share < 0.62, share
            path = cg.path
        # The child was moved back to the root cgroup; the directory and owner record are gone.
        assert not path.exists()
        assert not (netns.OWNERS_DIR / name).exists()
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


@root
@pytest.mark.root
def test_bad_fraction_is_rejected() -> None:
    with cgroup.CpuThrottle(f"spl-tf{PID}", None) as cg:
        with pytest.raises(RigError, match="cpu_fraction"):
            cg.set_fraction(0)
        assert cg.path is not None
        if cg.hierarchy is not None and cg.hierarchy.version == 1:
            assert (cg.path / "cpu.cfs_quota_us").read_text().strip() == "-1"


@root
@pytest.mark.root
def test_a_quota_of_at_most_one_cpu_runs_its_threads_on_one_cpu_until_they_leave() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs to tell a pinned thread from a free one")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    everywhere = os.sched_getaffinity(0)
    try:
        with cgroup.CpuThrottle(f"spl-tp{PID}", 0.25) as cg:
            cg.pin_cpu = 1
            cg.add_pid(child.pid)
            assert os.sched_getaffinity(child.pid) == {1}  # a board's one core
            cg.remove_pid(child.pid)
            assert os.sched_getaffinity(child.pid) == everywhere
            cg.set_fraction(2.0)  # two CPUs' quota: not one core's
            cg.add_pid(child.pid)
            assert os.sched_getaffinity(child.pid) == everywhere
    finally:
        child.kill()
        child.wait()


def _quota_period(cg: cgroup.CpuThrottle) -> tuple[int, int]:
    assert cg.hierarchy is not None and cg.path is not None
    if cg.hierarchy.version == 1:
        return int((cg.path / "cpu.cfs_quota_us").read_text()), int((cg.path / "cpu.cfs_period_us").read_text())
    quota, period = (cg.path / "cpu.max").read_text().split()
    return int(quota), int(period)


@root
@pytest.mark.root
def test_other_work_takes_its_share_of_the_board_and_waits_aside_runnable() -> None:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        with (
            cgroup.CpuThrottle(f"spl-tb{PID}", 0.2, period_us=20_000) as board,
            cgroup.CpuThrottle(f"spl-ta{PID}", cgroup.MIN_FRACTION, period_us=20_000) as aside,
        ):
            assert _quota_period(board) == (4000, 20_000)
            with cgroup.share_with(board, aside, [h.pid for h in hogs]):
                assert sorted(aside.pids()) == sorted(h.pid for h in hogs)
                assert _quota_period(board) == (1000, 20_000)  # a quarter: the device's share beside 3
                time.sleep(0.3)
                # throttled aside, yet runnable: the device's run-queue probe counts them
                assert {psutil.Process(h.pid).status() for h in hogs} == {psutil.STATUS_RUNNING}
                assert sum(_cpu_share(psutil.Process(h.pid), 1.0) for h in hogs) < 0.15
            assert _quota_period(board) == (4000, 20_000)
            with cgroup.share_with(board, aside, [h.pid for h in hogs] * 3):  # 1/10: below 1 ms a period
                quota, period = _quota_period(board)
                assert quota == 1000 and period == 50_000
            assert _quota_period(board) == (4000, 20_000)
            board.set_fraction(None)  # no quota, no share to shrink: they compete on the board instead
            with cgroup.share_with(board, aside, [hogs[0].pid]):
                assert hogs[0].pid in board.pids() and hogs[0].pid not in aside.pids()
                assert _quota_period(board)[0] == -1
    finally:
        for h in hogs:
            h.kill()
            h.wait()
