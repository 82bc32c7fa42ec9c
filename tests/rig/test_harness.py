"""The hardware-in-the-loop rig, two tiers: a short bench with every strategy, nothing left behind (also
after SIGKILL + cleanup), and the userspace link variant. Latency figures belong to bench/, not here.
Three tiers and a fleet: tests/rig/test_topologies.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from splitrt.cli import app as cli
from splitrt.profile import boards
from splitrt.rig import bench as rigbench
from splitrt.rig import cgroup, netns, tracespec
from splitrt.rig import harness as rig
from splitrt.rig import stats as rigstats
from tests.loopback import reap

STEP = "step:30,2/1.5"  # 1.5 s at 30 Mbit/s, then 2 Mbit/s: the best plan changes mid-run


def _cgroup_dirs(prefix: str) -> list[Path]:
    try:
        root = cgroup.detect().root
    except Exception:
        return []
    return sorted(root.glob(f"{prefix}*"))


def _leftovers(prefix: str) -> list[str]:
    out = [f"netns:{n}" for n in netns.list_netns(prefix)]
    out += [f"cgroup:{d}" for d in _cgroup_dirs(prefix)]
    links = netns.run_cmd(["ip", "-o", "link", "show"]).stdout
    out += [f"link:{line}" for line in links.splitlines() if prefix in line]
    qdiscs = netns.run_cmd(["tc", "qdisc", "show"]).stdout
    out += [f"qdisc:{line}" for line in qdiscs.splitlines() if prefix in line]
    return out


def _bench(
    tmp_path: Path,
    *,
    link: str,
    prefix: str | None,
    strategies: tuple[str, ...] = rigbench.STRATEGIES,
    duration_s: float = 2.0,
    turn_s: float = 3.0,
) -> dict[str, object]:
    cfg = rigbench.BenchConfig(
        model="squeezenet", trace=STEP, duration_s=duration_s, rate_hz=5.0, strategies=strategies, turn_s=turn_s
    )
    rc = rig.RigConfig(
        link=link, prefix=prefix, models=("squeezenet",), quota_cpus=0.5, pad_factor=3.0, workdir=tmp_path / "rig"
    )
    with rig.Rig(rc) as r:
        result = rigbench.run_bench(cfg, r)
    return result


@pytest.mark.root
def test_bench_every_strategy_then_nothing_left(tmp_path: Path) -> None:
    prefix = f"spl-t{os.getpid() % 100000}"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = _bench(tmp_path, link="kernel", prefix=prefix, duration_s=3.0, turn_s=1.0)
    assert result["link"] == "kernel"
    measured = [s for s in rigbench.STRATEGIES if s not in rigbench.ORACLE_REFS]  # oracles are computed, not played
    # 3 slices x each strategy, less a slice a strategy's last request ran past (a request over the 1 s
    # turn on a loaded host: runner._play skips it rather than replay part of the trace twice)
    turns = result["turns"]
    assert turns["turn_s"] == 1.0 and 2 * len(measured) <= turns["played"] <= 3 * len(measured), turns
    strategies = result["strategies"]
    assert isinstance(strategies, dict)
    assert set(strategies) == set(rigbench.STRATEGIES)
    for name, s in strategies.items():
        for key in ("mean_ms", "p50_ms", "p95_ms", "p99_ms", "completed", "failed", "switches"):
            assert key in s, (name, key)
        assert s["failed"] == 0, name
        assert s["completed"] >= 3, name
        assert s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"], name
    # the fixed strategies did what they are named for
    assert set(strategies["device-only"]["plans"]) == {"device"}
    assert {p.split("@")[0] for p in strategies["cloud-only"]["plans"]} == {"cloud"}
    assert strategies["device-only"]["switches"] == 0
    assert {p.split("@")[0] for n in ("route", "oracle-route") for p in strategies[n]["plans"]} <= {"device", "cloud"}
    # taking turns, each strategy still ran the window once, in order, on the same request schedule
    requests = result["timeline"]["requests"]  # type: ignore[index]
    for name in ("device-only", "static"):
        times = [t for t, _, _ in requests[name]]
        assert times == sorted(times) and times[0] < 0.4 and times[-1] > 2.5, (name, times)
        assert len(times) == 15, name  # 5 req/s x 3 s: device plans never fall behind the schedule
    # the device's head times were rescaled to what this model takes on the throttled device
    dcal = result["device_calibration"]
    assert isinstance(dcal, dict) and dcal["measured_ms"] > 0 and dcal["table_ms"] > 0
    assert dcal["speed_factor"] == pytest.approx(
        boards.load_board(rig.RigConfig().board).cpu_speed_factor * dcal["measured_ms"] / dcal["table_ms"]
    )
    # the trace played is the step, once
    assert result["timeline"]["bandwidth_mbps"] == [[0.0, 30.0], [1.5, 2.0]]  # type: ignore[index]
    json.dumps(result)  # serialisable as is
    # nothing left behind: namespaces (and with them veths and qdiscs), cgroups, child processes
    assert _leftovers(prefix) == []
    time.sleep(0.2)
    after = {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    }
    assert after <= before


_KILLED_RIG = """
import sys, time
from splitrt.rig import harness as rig, models, protocol as P
r = rig.Rig(rig.RigConfig(link="kernel", prefix=sys.argv[1], models=("squeezenet",), quota_cpus=0.5))
r.start()
r.set_quota(0.5)
(w,) = r.start_workers([P.Spec(model_path=str(models.model_path_for("squeezenet")))])
r.throttle(0, w.proc.pid)
print("ready", r.servers[-1][0].proc.pid, w.proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.root
def test_killed_rig_is_cleaned_up(tmp_path: Path) -> None:
    prefix = f"spl-k{os.getpid() % 100000}"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_RIG, prefix], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", line
        children = [int(x) for x in line[1:]]
        assert len(netns.list_netns(prefix)) == 3  # the device, the cloud, the switch between them
        assert len(_cgroup_dirs(prefix)) == 3  # the device's quota, its busy work's aside, the cloud's weight
    finally:
        reap(proc)  # SIGKILL, then its pipe closed
    # killed without any chance to clean up: the namespaces and the cgroup are still there
    assert netns.list_netns(prefix)
    assert cli.main(["rig", "cleanup"]) == 0
    assert _leftovers(prefix) == []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in children
    ):
        time.sleep(0.1)
    assert not [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_userspace_link_variant(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = _bench(
        tmp_path,
        link="userspace",
        prefix=None,
        strategies=("device-only", "cloud-only", "adaptive", "oracle"),
        duration_s=2.0,
    )
    assert result["link"] == "userspace"
    strategies = result["strategies"]
    assert isinstance(strategies, dict)
    assert set(strategies) == {"device-only", "cloud-only", "adaptive", "oracle"}
    assert all(s["failed"] == 0 and s["completed"] >= 3 for s in strategies.values())
    cal = result["calibration"]
    assert isinstance(cal, dict) and cal["quota_cpus"] is None and cal["pad_factor"] == 3.0
    # board emulation by padding: every device-only request took about 3x squeezenet's compute
    assert set(strategies["device-only"]["plans"]) == {"device"}
    time.sleep(0.2)
    after = {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    }
    assert after <= before


def test_transfer_time_follows_the_trace() -> None:
    t = tracespec.load_trace("step:1,8/2")
    # 1 Mbit at 1 Mbit/s from t=0: 1 s; 3 Mbit from 1 s: 1 Mbit by 2 s, then 2 Mbit at 8 Mbit/s = 0.25 s
    assert rigstats.transfer_ms(t, 0.0, 125_000) == pytest.approx(1000.0)
    assert rigstats.transfer_ms(t, 1.0, 375_000) == pytest.approx(1250.0)
    assert rigstats.burst_intervals("device-burst", 30) == [(10.0, 20.0)]
    assert rigstats.burst_intervals("device-burst", 130) == [(20.0, 40.0), (80.0, 100.0)]
    assert rigstats.burst_intervals("none", 130) == []
