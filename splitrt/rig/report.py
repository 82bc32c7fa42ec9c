"""One report for every topology (pure: the runner's ``Outcome`` in, figures out): per strategy latency
percentiles, device energy per inference (ESTIMATED from the board file's power figures), throughput,
where requests completed, per-server counts and utilisation, what a server kill did, bootstrap 95 %
intervals over (turn, device) groups (the requests of one device in one turn share its link's and the
host's moment: they are not independent), and adaptive's ratio to every other strategy. The hindsight
oracles (two tiers) are computed here, per device, over the reference run's request times, and reported
like the measured strategies."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from splitrt.rig import stats, strategies
from splitrt.rig.protocol import Record
from splitrt.rig.regret import bootstrap_ratio, call, interval, resampled
from splitrt.rig.runner import Outcome, Turn

# adaptive over each strategy: (label, which of summary's ``_groups``: latency, energy, counts; statistic)
RATIOS = (("mean", 0, "mean"), ("energy", 1, "mean"), ("throughput", 2, "mean"), ("p95", 0, "p95"))


def bootstrap_ci(
    groups: Sequence[Sequence[float]], *, stat: str = "mean", n: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95 % interval of ``stat`` (mean | p95) over ``groups`` of requests, the groups resampled."""
    gs = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if len(gs) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    if stat == "mean":  # sums and counts of the resampled groups: no concatenation
        pick = rng.integers(0, len(gs), (n, len(gs)))
        sums, counts = np.array([g.sum() for g in gs]), np.array([len(g) for g in gs])
        return interval(sums[pick].sum(axis=1) / counts[pick].sum(axis=1))
    return interval([resampled(gs, rng, "p95") for _ in range(n)])


def kill_account(turn: Turn) -> dict[str, int]:
    """After the kill: requests that still completed on the killed server (must be 0), requests served
    by another server, and of those ``moved``: the ones of devices the killed server had served."""
    out = {"after_kill_on_killed": 0, "after_kill_on_others": 0, "moved": 0}
    kill, killed = turn.kill_at_s, turn.killed
    if kill is None or not killed:
        return out
    for recs in turn.devices:
        used = any(r.server == killed and r.t_s < kill for r in recs if not r.error)
        for r in recs:  # a request that started before the kill may have been answered just before it
            if r.error or r.server is None or r.t_s * 1e3 + r.latency_ms <= kill * 1e3:
                continue
            if r.server == killed and r.t_s >= kill:
                out["after_kill_on_killed"] += 1
            elif r.server != killed:
                out["after_kill_on_others"] += 1
                out["moved"] += int(used)
    return out


def summary(
    turns: Sequence[Turn], played: Sequence[Any], power: Any, servers: Sequence[str], server_cpus: float, seed: int
) -> dict[str, Any]:
    """One strategy's figures over its turns; ``played[i]``: device i's first-hop window (energy)."""
    per_dev = [(i, d) for t in turns for i, d in enumerate(t.devices)]  # (device, its records) per turn
    groups = [[r for r in d if not r.error] for _, d in per_dev]
    recs = [r for _, d in per_dev for r in d]
    ok = [r for g in groups for r in g]
    energy = [[stats.energy_mj(r, played[i % len(played)], power) for r in d if not r.error] for i, d in per_dev]
    lat = [[r.latency_ms for r in g] for g in groups]
    duration = sum(t.until_s - t.from_s for t in turns)
    kills = [kill_account(t) for t in turns]
    cpu = {a: sum(t.server_cpu_s.get(a, 0.0) for t in turns) for a in servers}
    s = stats.summarize(
        [r.latency_ms for r in ok],
        [r.plan for r in ok],
        len(recs) - len(ok),
        [e for g in energy for e in g],
        sum(r.fallback for r in ok),
    )
    s.update(
        requests=len(recs),
        throughput_rps=len(ok) / duration if duration > 0 else math.nan,
        local=sum(1 for r in ok if r.finished_by == "device"),
        by_server={a: sum(1 for r in ok if r.server == a) for a in servers},
        server_util={
            a: cpu[a] / (duration * server_cpus) if duration > 0 and server_cpus > 0 else math.nan for a in servers
        },
        **{k: sum(x[k] for x in kills) for k in ("after_kill_on_killed", "after_kill_on_others", "moved")},
        mean_ci_ms=list(bootstrap_ci(lat, seed=seed)),
        p95_ci_ms=list(bootstrap_ci(lat, stat="p95", seed=seed)),
        energy_ci_mj=list(bootstrap_ci(energy, seed=seed)),
        finished_by={k: sum(1 for r in ok if r.finished_by == k) for k in ("device", "edge", "cloud")},
        via_edge=sum(1 for r in ok if ">" in r.plan),
        mismatched=sum(1 for r in ok if r.match is False),
        segments=len(turns),
        duration_s=duration,
        load_avg=[list(t.load_avg) for t in turns],
        refused=sum(t.refused for t in turns),
    )
    s["accounted"] = s["completed"] == s["local"] + sum(s["by_server"].values())
    s["energy_increment_mj"] = s["energy_mj"]  # kept for the JSON's readers: the energy model counts idle + radio
    s["_groups"] = (lat, energy, [[float(len(g))] for g in groups])
    return s


def oracle_turns(
    out: Outcome, ref: str, cuts: Sequence[str] | None, bursts: Sequence[tuple[float, float]]
) -> list[Turn]:
    """The hindsight oracle on ``ref``'s request times, per device: the cheapest plan over ``cuts`` given
    the per-cut costs measured on that device (``stats.measured_costs``) and the bandwidth each request
    met; as turns of synthetic records (``stats.oracle``). Needs two tiers."""
    table, hop = out.tables[0], out.spec.hops[0]
    n = max((len(t.devices) for t in out.turns), default=0)
    per_dev = []
    for i in range(n):
        played = hop.played[i % len(hop.played)]
        mine = [r for t in out.turns for r in t.devices[i]]
        costs = stats.measured_costs(table, mine, played, bursts, hop.rtt_ms)
        recs = [r for t in out.turns if t.name == ref for r in t.devices[i]]
        # a reference plan outside ``cuts`` (another run than route's) is no candidate of the oracle's
        real = [
            None if r.error or r.fallback or (cuts and r.plan.split("@")[0] not in cuts) else (r.plan, r.latency_ms)
            for r in recs
        ]
        picks = stats.oracle(table, costs, [r.t_s for r in recs], played, bursts, out.spec.codecs, real, cuts=cuts)
        per_dev.append(
            {r.i: _synthetic(r, p, ms, table, costs, bursts) for r, (p, ms) in zip(recs, picks, strict=True)}
        )
    return [
        replace(t, devices=tuple(tuple(per_dev[i][r.i] for r in d) for i, d in enumerate(t.devices)))
        for t in out.turns
        if t.name == ref
    ]


def _synthetic(
    r: Record, plan: str, ms: float, table: Any, costs: Any, bursts: Sequence[tuple[float, float]]
) -> Record:
    cut, _, codec = plan.partition("@")
    i = table.index(cut)
    ratio = costs.device_ratio_burst if stats.in_intervals(r.t_s, bursts) else costs.device_ratio_idle
    sent = 0.0 if cut == "device" else float(table.sent_bytes[i, table.codec_index(codec)])
    return Record(
        i=r.i,
        t_s=r.t_s,
        latency_ms=ms,
        plan=plan,
        where="local" if cut == "device" else "cloud",
        head_ms=float(table.head_ms[i]) * ratio if ratio is not None else 0.0,  # None: the oracle picks no head
        rpc_ms=ms,
        bytes_up=sent,
        finished_by="device" if cut == "device" else "cloud",
    )


def strategies_report(
    out: Outcome, power: Any, bursts: Sequence[tuple[float, float]] = ()
) -> tuple[dict[str, dict[str, Any]], dict[str, list[Turn]]]:
    """Every strategy's ``summary`` (oracles included where asked, two tiers), with adaptive's ratio to
    each other strategy (``adaptive_over_this``: mean, p95, energy, throughput, each a 95 % interval and
    its call); and every strategy's turns (the oracles' synthetic ones)."""
    by_name = {n: [t for t in out.turns if t.name == n] for n in out.choices}
    for oname, ref in strategies.ORACLE_REFS.items():
        ref = ref if ref in by_name else next(iter(by_name), "")  # the reference run, else the first one
        if oname in out.spec.strategies and ref:
            by_name[oname] = oracle_turns(out, ref, ("cloud", "device") if oname == "oracle-route" else None, bursts)
    played, seed = out.spec.hops[0].played, out.spec.seed
    res = {n: summary(ts, played, power, out.servers, out.server_cpus, seed) for n, ts in by_name.items()}
    groups = {n: s.pop("_groups") for n, s in res.items()}
    for n, s in res.items():
        c = out.choices.get(n)
        s.update(
            tiers=c.tiers if c else 2,
            policy=c.policy
            if c
            else f"hindsight over the {by_name[n][0].name if by_name[n] else '-'} run's request times",
        )
        if "adaptive" not in res or n == "adaptive":
            continue
        ratios: dict[str, dict[str, Any]] = {}
        for label, k, stat in RATIOS:
            ci = bootstrap_ratio(groups["adaptive"][k], groups[n][k], stat=stat, seed=seed, n=1000)
            ratios[label] = {"ci": list(ci), "call": call(ci) if not math.isnan(ci[0]) else "n/a"}
        flip = {"better": "worse", "worse": "better"}  # more throughput is better
        ratios["throughput"]["call"] = flip.get(ratios["throughput"]["call"], ratios["throughput"]["call"])
        s["adaptive_over_this"] = ratios
    return res, by_name


def verdict(strategies_: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The fleet's acceptance line: adaptive has the highest throughput, at a p95 equal to (the interval
    of the ratio holds 1) or better than every fixed strategy's, and no request failed or was lost (the
    kill included)."""
    a = strategies_.get("adaptive")
    others = {n: s for n, s in strategies_.items() if n in strategies.FIXED}
    if a is None or not others:
        return {"pass": False, "reasons": ["needs adaptive and at least one fixed strategy"], "failed": 0}
    reasons = []
    for name, s in others.items():
        if not a["throughput_rps"] > s["throughput_rps"]:
            reasons.append(f"throughput {a['throughput_rps']:.2f} req/s not above {name}'s {s['throughput_rps']:.2f}")
        if not a["p95_ms"] <= s["p95_ms"] and s.get("adaptive_over_this", {}).get("p95", {}).get("call") != "same":
            reasons.append(f"p95 {a['p95_ms']:.0f} ms above {name}'s {s['p95_ms']:.0f} ms")
    failed = sum(int(s["failed"]) for s in strategies_.values())
    if failed:
        reasons.append(f"{failed} failed request(s)")
    measured = [n for n in strategies_ if n not in strategies.ORACLE_REFS]
    lost = [n for n in measured if not strategies_[n]["accounted"] or strategies_[n]["after_kill_on_killed"]]
    if lost:
        reasons.append(f"requests unaccounted or served by the killed server: {', '.join(lost)}")
    return {"pass": not reasons, "reasons": reasons, "failed": failed}


def gain_pct(adaptive: float, other: float) -> float:
    """How much lower adaptive is than ``other``, in % of ``other`` (negative: higher)."""
    return 100.0 * (1.0 - adaptive / other) if other > 0 and not math.isnan(other) else math.nan


def gains(res: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Three tiers: adaptive's gain in mean latency and energy over the static split chosen with the
    same objective (``static-2tier``), over the best static 2-tier strategy and the best of any static."""
    if "adaptive" not in res:
        return {}
    a, out = res["adaptive"], {}
    two = ("device-only", "cloud-only", "static-2tier")
    for label, names in (("static_split", ("static-2tier",)), ("static_2tier", two), ("any_static", strategies.FIXED)):
        for key, figure in (("mean_ms", "latency"), ("energy_mj", "energy")):
            have = [n for n in names if n in res and not math.isnan(float(res[n][key]))]
            best = min(have, key=lambda n: float(res[n][key])) if have else None
            pct = gain_pct(float(a[key]), float(res[best][key])) if best else math.nan
            out[f"{figure}_vs_{label}"] = {"against": best, "pct": pct}
    return out
