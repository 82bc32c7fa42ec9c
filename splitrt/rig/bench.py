"""The end-to-end benchmark in the rig (``splitrt bench``): every strategy on the same trace window.

One device worker process holds one ``AdaptiveDevice`` per strategy. The window is played in turns: the
strategies take turns on the same ``turn_s`` slice of the trace (the link replays it for each), in
rounds whose order rotates, so every strategy's requests sit on average at the same moment and a slow
drift of the host's speed (this VM: the same plan measured 339 and 386 ms a minute apart) cancels
instead of favouring whichever strategy ran in a fast minute. A strategy's own clock stands still and
its prober is parked while the others take their turns: each strategy sees one continuous run of the
window, as a deployment would. The oracle is computed offline (``rigstats.oracle``) from the measured
per-cut costs and the bandwidth each request met.

- ``run_bench(BenchConfig(model, trace, bandwidth_scale, load, rate_hz, duration_s, turn_s=1.0, trace_offset_s,
  rtt_ms, codecs, strategies), rig) -> dict``: one device worker process (``python -m splitrt.rig.worker
  worker``) holds one ``AdaptiveDevice`` per strategy (``prepare``: 2 s warm-up) and runs one strategy's turn at
  a time (``run``: ``t0``, ``from_s``, ``until_s``). ``turn_plan`` orders the turns (round r starts with
  strategy r mod n). A strategy's ``TurnClock`` stands still and its ``TurnProber`` is parked between its turns;
  a request that would start at or after ``until_s`` waits for its next turn. JSON keys ``link``,
  ``strategies.{NAME}.{mean_ms,p50_ms,p95_ms,p99_ms,completed,failed,switches,energy_mj, plans}``,
  ``calibration``, ``cloud_calibration``, ``device_calibration``, ``measured_costs``, ``turns``, ``timeline``.
- In the rig, the device-load signal is the measured head time / table head time and, while no head runs, the
  run queue of the board's other processes (``HeadLoad``, ``RunQueueProbe``): psutil sees the host.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from splitrt.errors import ConfigError
from splitrt.rig import traces
from splitrt.rig.calibration import Calibration
from splitrt.rig.harness import Rig
from splitrt.rig.models import cost_table_for, model_path_for, profile_for
from splitrt.rig.stats import (
    burst_intervals,
    energy_mj,
    in_intervals,
    measured_costs,
    oracle,
    plan_cut,
    summarize,
)
from splitrt.rig.tracespec import DEFAULT_RTT_MS, FAMILY_RTT_MS, family_median_mbps, load_trace, trace_family

STRATEGIES = (
    "device-only",
    "cloud-only",
    "static",
    "static-fixed",
    "periodic",
    "route",
    "adaptive",
    "oracle",
    "oracle-route",
)
# route: the adaptive runtime restricted to the cuts device and cloud (whole-request routing, the baseline
# splitting must beat); oracle-route: the hindsight oracle over those two cuts, on the route run's times.
ORACLE_REFS = {"oracle": "adaptive", "oracle-route": "route"}
# static-fixed (the static cut at the trace family's median bandwidth, whatever the cell's scale) is ONE
# choice across a grid's cells: the regret tables run it; a single bench run does not need it.
DEFAULT_STRATEGIES = ("device-only", "cloud-only", "static", "periodic", "adaptive", "oracle")
LOADS = ("none", "device-burst", "cloud-busy")
# The HSDPA traces the controller and estimators were tuned on, and ones never used for tuning.
TRACE_SETS = {
    "tuned": ("hsdpa/bus", "hsdpa/car", "hsdpa/metro", "hsdpa/train"),
    "heldout": ("hsdpa/ferry", "hsdpa/tram", "hsdpa/bus-0929", "hsdpa/car-elverum"),
}


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    model: str = "resnet50"
    trace: str = "hsdpa/car"
    bandwidth_scale: float = 1.0
    load: str = "none"
    rate_hz: float = 4.0
    duration_s: float = 30.0  # the trace window every strategy plays
    turn_s: float = 1.0  # strategies take turns on slices this long (>= duration_s: one whole run each)
    warmup_s: float = 2.0  # uncounted requests per strategy before its first turn
    trace_offset_s: float = 0.0
    rtt_ms: float | None = None  # None: typical of the trace's family
    codecs: tuple[str, ...] | None = None  # None: every codec of the cost table, for every strategy
    cuts: tuple[str, ...] | None = None  # the cuts the runtime's plans may use (constraints); None: all
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    deadline_ms: float = 5000.0
    periodic_s: float = 5.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.load not in LOADS:
            raise ConfigError(f"load: expected one of {', '.join(LOADS)}, got {self.load!r}")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad:
            raise ConfigError(f"strategies: expected names in {', '.join(STRATEGIES)}, got {bad}")
        if self.warmup_s < 0:
            raise ConfigError(f"warmup_s: expected >= 0, got {self.warmup_s}")
        if not self.rate_hz > 0 or not self.duration_s > 0 or not self.bandwidth_scale > 0 or not self.turn_s > 0:
            raise ConfigError(
                f"rate_hz, duration_s, turn_s, bandwidth_scale must be > 0, got {self.rate_hz}, "
                f"{self.duration_s}, {self.turn_s}, {self.bandwidth_scale}"
            )


def add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """The acceptance grid's options, shared by ``bench/bench_rig_grid.py`` and ``bench/bench_sim.py``:
    every shipped HSDPA trace x resnet50, inception_v1 on rpi4 x bandwidth scale 1, 5 x load none,
    device-burst by default."""
    p.add_argument(
        "--traces",
        default="tuned",
        help="comma-separated shipped traces, or 'tuned' (the HSDPA traces the controller was tuned on) "
        "or 'heldout' (HSDPA traces never used for tuning)",
    )
    p.add_argument("--models", default="resnet50,inception_v1")
    p.add_argument("--scales", default="1,5")
    p.add_argument("--loads", default="none,device-burst")
    p.add_argument("--board", default="rpi4")


def grid_cells(args: argparse.Namespace) -> list[tuple[str, str, float, str]]:
    """(trace, model, bandwidth scale, load) of every cell, in the order the tables print them."""
    names = [t for item in args.traces.split(",") for t in TRACE_SETS.get(item, (item,))]
    return list(
        itertools.product(
            names, args.models.split(","), [float(x) for x in args.scales.split(",")], args.loads.split(",")
        )
    )


def turn_plan(names: Sequence[str], duration_s: float, turn_s: float) -> list[tuple[str, float]]:
    """(strategy, end of its slice) in play order. Round r starts with strategy r mod n: over n rounds
    every strategy takes every place once (a linear drift of the host cancels exactly), and no strategy
    takes two turns in a row (with 3 or more), so a few slow seconds of the host are spread over all
    strategies instead of landing on one strategy's two adjacent turns."""
    rounds = max(1, math.ceil(duration_s / turn_s - 1e-9))
    out = []
    n = len(names)
    for r in range(rounds):
        until = min(duration_s, (r + 1) * turn_s)
        out += [(names[(r + i) % n], until) for i in range(n)]
    return out


def strategy_policies(cfg: BenchConfig, table: Any, rtt_ms: float) -> dict[str, str]:
    """Policy string per measured strategy (the oracle is computed, not run)."""
    from splitrt.plan import costmodel, solver

    cloud = solver.solve(
        table,
        costmodel.Conditions(link=costmodel.Link(bandwidth_mbps=1.0, rtt_ms=rtt_ms)),
        cuts=["cloud"],
        codecs=list(cfg.codecs) if cfg.codecs else None,
    )
    family = family_median_mbps(trace_family(load_trace(cfg.trace)))

    def static_at(mbps: float) -> str:
        cond = costmodel.Conditions(link=costmodel.Link(bandwidth_mbps=mbps, rtt_ms=rtt_ms))
        return solver.solve(table, cond, codecs=list(cfg.codecs) if cfg.codecs else None).key

    return {
        "device-only": "fixed:device",
        "cloud-only": f"fixed:{cloud.key}",
        "static": f"fixed:{static_at(family * cfg.bandwidth_scale)}",
        "static-fixed": f"fixed:{static_at(family)}",
        "periodic": f"periodic:{cfg.periodic_s:g}",
        "route": "route",
        "adaptive": "adaptive",
    }


def likely_cuts(table: Any, rtt_ms: float, codecs: Sequence[str] | None) -> list[str]:
    """Every cut the solver picks over 0.05-1000 Mbit/s and device/cloud loads 1-8 (warmed up front)."""
    from splitrt.plan import costmodel, solver

    cuts = {"device", "cloud"}
    for i in range(41):
        bw = 0.05 * 10 ** (i / 8)
        for dl in (1.0, 2.0, 4.0, 8.0):
            for cl in (1.0, 3.0, 8.0):
                cond = costmodel.Conditions(
                    link=costmodel.Link(bandwidth_mbps=bw, rtt_ms=rtt_ms), device_load=dl, cloud_load=cl
                )
                cuts.add(solver.solve(table, cond, codecs=list(codecs) if codecs else None).cut)
    return sorted(cuts)


def run_bench(
    cfg: BenchConfig,
    rig: Rig,
    *,
    progress: Callable[[str], None] | None = None,
    live: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every strategy of ``cfg`` in ``rig`` on the same trace window; return the result dict."""
    from splitrt.graph import model as graph
    from splitrt.rig import shaper

    say = progress or (lambda s: None)
    model_file = model_path_for(cfg.model)
    mg = graph.load(model_file)
    rig.install_model(model_file)
    cal = rig.calibrate()
    speed = rig.board.cpu_speed_factor
    prof_path = profile_for(cfg.model, model_file, rig.workdir, say)
    table = cost_table_for(prof_path, mg.sha256, speed)
    profiled_cloud_ms = float(table.tail_ms[table.index("cloud")])
    full = load_trace(cfg.trace)
    rtt = cfg.rtt_ms if cfg.rtt_ms is not None else FAMILY_RTT_MS.get(trace_family(full) or "", DEFAULT_RTT_MS)
    rig.set_rtt(rtt)
    window = full.window(cfg.trace_offset_s, cfg.duration_s)
    played = window.scaled(cfg.bandwidth_scale) if cfg.bandwidth_scale != 1 else window
    spec = {
        "mode": "device",
        "model_path": str(model_file),
        "profile_path": str(prof_path),
        "speed_factor": speed,
        "pad_factor": cal.pad_factor,
        "cloud": rig.cloud_address,
        "codecs": list(cfg.codecs) if cfg.codecs else None,
        "cuts": list(cfg.cuts) if cfg.cuts else None,
        "deadline_ms": cfg.deadline_ms,
        "threads": rig.config.device_threads,
        "seed": cfg.seed,
        "board": rig.board.name,
        "warm_cuts": likely_cuts(table, rtt, cfg.codecs),
    }
    names = [n for n in cfg.strategies if n not in ORACLE_REFS]
    worker = rig.start_worker(spec, name="device")
    try:
        # Cloud calibration: the host profile may have been measured on a busier host; the cloud's
        # whole-model time now (server-side compute, unshaped link) rescales the profile's tail times,
        # as an operator would re-profile the server. Loads >= 1 cannot correct a too slow profile.
        rig.shaper.set_rate(None)
        cloud_ms = float(worker.call({"cmd": "cloud-calibrate", "runs": 5}, 300)["tail_ms"])
        cloud_factor = cloud_ms / profiled_cloud_ms if profiled_cloud_ms > 0 else 1.0
        table = cost_table_for(prof_path, mg.sha256, speed, cloud_factor)
        say(
            f"cloud: {cfg.model} whole model {cloud_ms:.0f} ms on the server now (profile "
            f"{profiled_cloud_ms:.0f} ms): tail times x{cloud_factor:.2f}"
        )
        # Device calibration, per model: the board's speed factor was calibrated on resnet50 and leaves
        # other models (and resnet50 itself, by the calibration's tolerance) 4-6 % off; time this model
        # whole on the throttled device and rescale the head times, as an operator profiling the board
        # would. Every strategy plans with the same table.
        profiled_device_ms = float(table.head_ms[table.index("device")])
        rig.throttle_in(worker.proc.pid)
        try:
            device_ms = float(worker.call({"cmd": "device-calibrate", "runs": 5}, 300)["head_ms"])
        finally:
            rig.throttle_out(worker.proc.pid)
        if profiled_device_ms > 0 and device_ms > 0:
            speed = speed * device_ms / profiled_device_ms
        table = cost_table_for(prof_path, mg.sha256, speed, cloud_factor)
        say(
            f"device: {cfg.model} whole model {device_ms:.0f} ms on the emulated {rig.board.name} (table "
            f"{profiled_device_ms:.0f} ms): head times x{device_ms / max(profiled_device_ms, 1e-9):.2f}"
        )
        policies = strategy_policies(cfg, table, rtt)
        cloud_plan = policies["cloud-only"].split(":", 1)[1]
        for name in names:
            say(f"[{name}] policy {policies[name]}: preparing")
            rig.shaper.set_rate(max(played.rate_at(0.0), shaper.MIN_RATE_MBPS))
            (rig.workdir / f"requests-{name}.jsonl").unlink(missing_ok=True)
            worker.call(
                {
                    "cmd": "prepare",
                    "name": name,
                    "policy": policies[name],
                    "with_cloud": name != "device-only",
                    "cloud_factor": cloud_factor,
                    "speed_factor": speed,
                    "rate_hz": cfg.rate_hz,
                    "warmup_s": cfg.warmup_s,
                },
                300,
            )
        roles = worker.call({"cmd": "roles"}, 30)
        rig.throttle_threads(worker.proc.pid, roles.get("compute_tids", []), roles.get("other_tids", []))
        try:
            runs = _play_turns(cfg, rig, worker, played, names, policies, model_file, cloud_plan, say, live)
        finally:
            rig.throttle_out(worker.proc.pid)
    finally:
        worker.close()
    result = assemble(cfg, rig, table, played, rtt, runs, cal)
    result["cloud_calibration"] = {
        "model": cfg.model,
        "measured_ms": cloud_ms,
        "profile_ms": profiled_cloud_ms,
        "factor": cloud_factor,
    }
    result["device_calibration"] = {
        "model": cfg.model,
        "measured_ms": device_ms,
        "table_ms": profiled_device_ms,
        "speed_factor": speed,
    }
    result["policies"] = policies
    result["turns"] = {"turn_s": cfg.turn_s, "played": len(turn_plan(names, cfg.duration_s, cfg.turn_s))}
    return result


def _play_turns(
    cfg: BenchConfig,
    rig: Rig,
    worker: Any,
    played: traces.Trace,
    names: Sequence[str],
    policies: dict[str, str],
    model_file: Path,
    cloud_plan: str,
    say: Callable[[str], None],
    live: Callable[[str], None] | None,
) -> dict[str, dict[str, Any]]:
    from splitrt.rig import shaper

    runs: dict[str, dict[str, Any]] = {
        n: {"policy": policies[n], "records": [], "load_intervals": [], "rates": [], "stats": {}} for n in names
    }
    pos = dict.fromkeys(names, 0.0)  # where each strategy is in the window
    count = dict.fromkeys(names, 0)
    for name, until in turn_plan(names, cfg.duration_s, cfg.turn_s):
        from_s = pos[name]
        if from_s >= until:  # its last request of the previous turn ran past this slice
            continue
        log_path = rig.workdir / f"requests-{name}.jsonl"

        def on_event(ev: dict[str, Any], name: str = name) -> None:
            count[name] += 1
            if live is not None:
                t = float(ev["t_s"])
                live(
                    f"[{name}] {t:5.1f}/{cfg.duration_s:g} s  req {count[name]:3d}  "
                    f"link {played.rate_at(t):6.2f} Mbit/s  plan {ev['plan']:<14} {ev['latency_ms']:7.0f} ms"
                )

        worker.on_event = on_event
        # The link plays the window from this strategy's position on, until the worker is done (its last
        # request may end past the slice: the link keeps following the trace meanwhile).
        player = shaper.TracePlayer(
            rig.shaper, played.window(from_s, cfg.duration_s - from_s), duration_s=cfg.duration_s - from_s
        )
        t0 = time.monotonic() + 0.05
        try:
            with rig.load_driver(cfg.load, cfg.duration_s, t0, model_file, cloud_plan, from_s=from_s) as applied:
                worker.send(
                    {
                        "cmd": "run",
                        "name": name,
                        "t0": t0,
                        "from_s": from_s,
                        "until_s": until,
                        "rate_hz": cfg.rate_hz,
                        "tasks_file": rig.board_tasks_file(),
                        "log_path": str(log_path),
                    }
                )
                while time.monotonic() < t0:
                    time.sleep(0.005)
                player.start()
                done = worker.reply(until - from_s + cfg.deadline_ms / 1e3 + 120)
                player.stop()
        finally:
            worker.on_event = None
        pos[name] = max(until, float(done["end_s"]))
        run = runs[name]
        run["load_intervals"] += list(applied)
        run["rates"] += [[round(from_s + t, 3), r] for t, r in player.log]
        run["stats"] = done.get("stats", {})
    if live is not None:
        live("")
    for name in names:
        log_path = rig.workdir / f"requests-{name}.jsonl"
        recs = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
        runs[name]["records"] = recs
        mean = statistics.fmean(r["latency_ms"] for r in recs) if recs else math.nan
        say(f"[{name}] {len(recs)} requests, mean {mean:.0f} ms")
    return runs


def assemble(
    cfg: BenchConfig,
    rig: Rig,
    table: Any,
    played: traces.Trace,
    rtt_ms: float,
    runs: dict[str, dict[str, Any]],
    cal: Calibration,
) -> dict[str, Any]:
    power = rig.board.power
    sched = burst_intervals(cfg.load, cfg.duration_s)
    strategies: dict[str, Any] = {}
    requests: dict[str, list[list[Any]]] = {}
    for name, run in runs.items():
        recs = run["records"]
        ok = [r for r in recs if not r.get("error")]
        strategies[name] = summarize(
            [r["latency_ms"] for r in ok],
            [r["plan"] for r in ok],
            failed=len(recs) - len(ok),
            energies=[energy_mj(r, played, power) for r in ok],
            fallbacks=sum(1 for r in ok if r.get("fallback")),
        )
        strategies[name]["policy"] = run["policy"]
        requests[name] = [[round(float(r["t_s"]), 3), round(float(r["latency_ms"]), 1), r["plan"]] for r in ok]
    costs = measured_costs(table, runs, played, sched, rtt_ms)
    for oname, ref_name in ORACLE_REFS.items():
        if oname not in cfg.strategies or not runs:
            continue
        ref = ref_name if ref_name in runs else next(iter(runs))
        strategies[oname], requests[oname] = _oracle_of(
            cfg,
            table,
            costs,
            runs[ref]["records"],
            played,
            sched,
            power,
            cuts=("cloud", "device") if oname == "oracle-route" else None,
        )
        strategies[oname]["policy"] = f"hindsight over the {ref} run's request times"
    bw = [[round(t, 3), r] for t, r in zip(played.times_s, played.rates_mbps, strict=True)]
    return {
        "link": rig.kind,
        "model": cfg.model,
        "trace": cfg.trace,
        "trace_offset_s": cfg.trace_offset_s,
        "board": rig.board.name,
        "bandwidth_scale": cfg.bandwidth_scale,
        "load": cfg.load,
        "rate_hz": cfg.rate_hz,
        "duration_s": cfg.duration_s,
        "rtt_ms": rtt_ms,
        "codecs": list(cfg.codecs) if cfg.codecs else list(table.codecs),
        "calibration": {
            **{k: v for k, v in asdict(cal).items() if k != "rounds"},
            "rounds": cal.rounds,
            "error_pct": cal.error_pct,
        },
        "measured_costs": costs.as_dict(),
        "strategies": strategies,
        "timeline": {
            "bandwidth_mbps": bw,
            "load_intervals": sched
            if cfg.load == "device-burst"
            else ([[0.0, cfg.duration_s]] if cfg.load == "cloud-busy" else []),
            "requests": requests,
        },
    }


def _oracle_of(
    cfg: BenchConfig,
    table: Any,
    costs: Any,
    records: list[dict[str, Any]],
    played: traces.Trace,
    sched: list[tuple[float, float]],
    power: Any,
    cuts: Sequence[str] | None,
) -> tuple[dict[str, Any], list[list[Any]]]:
    """The hindsight oracle over ``cuts`` on a reference run's request times: its summary and requests."""
    times = [float(r["t_s"]) for r in records]
    real = [None if r.get("error") or r.get("fallback") else (str(r["plan"]), float(r["latency_ms"])) for r in records]
    picks = oracle(table, costs, times, played, sched, cfg.codecs, real, cuts=cuts)
    energies = []
    for t, (plan, ms) in zip(times, picks, strict=True):
        cut = plan_cut(plan)
        i = table.index(cut)
        ratio = costs.device_ratio_burst if in_intervals(t, sched) else costs.device_ratio_idle
        h = float(table.head_ms[i]) * ratio
        rec = {
            "t_s": t,
            "latency_ms": ms,
            "head_ms": h,
            "where": "local" if cut == "device" else "cloud",
            "rpc_ms": ms,
            "bytes_up": 0 if cut == "device" else float(table.sent_bytes[i, table.codec_index(plan.split("@")[1])]),
        }
        energies.append(energy_mj(rec, played, power))
    summary = summarize([ms for _, ms in picks], [p for p, _ in picks], 0, energies)
    return summary, [[round(t, 3), round(ms, 1), p] for t, (p, ms) in zip(times, picks, strict=True)]
