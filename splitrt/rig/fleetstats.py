"""The fleet rig's arithmetic (pure: records in, figures out): per strategy throughput, latency
percentiles, where requests completed, server utilisation, what the server kill did, and bootstrap
intervals of adaptive against each other strategy.

A segment is one strategy's run of the whole fleet (``rig.fleet``), a dict::

    {"strategy", "round", "duration_s", "kill_at_s" (None: no kill), "killed" (address),
     "devices": [[record, ...] per device], "server_cpu_s": {address: CPU seconds in the segment},
     "server_cpus": CPU limit of each server}

and a record is a list of ``fleetworker.RECORD_FIELDS``: ``[t_s, latency_ms, plan, server, fallback, error,
predicted_ms, head_ms, encode_ms, rpc_ms, queue_ms, tail_ms]`` (the last six may be absent).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from splitrt.rig.regret import bootstrap_ratio, call

T_S, LATENCY_MS, PLAN, SERVER, FALLBACK, ERROR = range(6)
FIXED_STRATEGIES = ("device-only", "cloud-only", "static")


def _pct(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else math.nan


def groups(segments: Sequence[Mapping[str, Any]]) -> list[list[list[Any]]]:
    """Records grouped by (segment, device): the units the bootstrap resamples (a device's requests in
    one segment share its link's moment; devices differ in link and CPU)."""
    return [list(recs) for seg in segments for recs in seg["devices"]]


def kill_account(seg: Mapping[str, Any]) -> dict[str, int]:
    """After the kill: requests that still completed on the killed server (must be 0), requests served
    by another server, and of those ``moved``: the ones of devices the killed server had served."""
    kill, killed = seg.get("kill_at_s"), seg.get("killed")
    out = {"after_kill_on_killed": 0, "after_kill_on_others": 0, "moved": 0}
    if kill is None or not killed:
        return out
    for recs in seg["devices"]:
        used_killed = any(r[SERVER] == killed and float(r[T_S]) < kill for r in recs if not r[ERROR])
        for r in recs:
            # A request that started before the kill may have been answered just before it.
            if r[ERROR] or r[SERVER] is None or float(r[T_S]) * 1e3 + float(r[LATENCY_MS]) <= kill * 1e3:
                continue
            if r[SERVER] == killed and float(r[T_S]) >= kill:
                out["after_kill_on_killed"] += 1
            elif r[SERVER] != killed:
                out["after_kill_on_others"] += 1
                out["moved"] += int(used_killed)
    return out


def plan_breakdown(recs: Sequence[Sequence[Any]]) -> dict[str, dict[str, float]]:
    """Per plan: requests, and the mean of the measured and predicted latency and of each part."""
    parts = ("predicted_ms", "head_ms", "encode_ms", "rpc_ms", "queue_ms", "tail_ms")
    out: dict[str, dict[str, float]] = {}
    for plan in sorted({r[PLAN] for r in recs}):
        mine = [r for r in recs if r[PLAN] == plan]
        row = {"n": float(len(mine)), "latency_ms": float(np.mean([float(r[LATENCY_MS]) for r in mine]))}
        for k, name in enumerate(parts, start=ERROR + 1):
            xs = [float(r[k]) for r in mine if len(r) > k and r[k] is not None]
            if xs:
                row[name] = float(np.mean(xs))
        out[plan] = row
    return out


def summarize(segments: Sequence[Mapping[str, Any]], servers: Sequence[str]) -> dict[str, Any]:
    """One strategy's figures over its segments."""
    recs = [r for g in groups(segments) for r in g]
    ok = [r for r in recs if not r[ERROR]]
    lat = [float(r[LATENCY_MS]) for r in ok]
    duration = sum(float(s["duration_s"]) for s in segments)
    by_server = {a: sum(1 for r in ok if r[SERVER] == a) for a in servers}
    local = sum(1 for r in ok if r[SERVER] is None)
    cpu_s = {a: sum(float(s["server_cpu_s"].get(a, 0.0)) for s in segments) for a in servers}
    limit = float(segments[0]["server_cpus"]) if segments else math.nan
    kills = [kill_account(s) for s in segments]
    plans: dict[str, int] = {}
    for r in ok:
        plans[r[PLAN]] = plans.get(r[PLAN], 0) + 1
    return {
        "requests": len(recs),
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "throughput_rps": len(ok) / duration if duration > 0 else math.nan,
        "mean_ms": float(np.mean(lat)) if lat else math.nan,
        "p50_ms": _pct(lat, 50),
        "p95_ms": _pct(lat, 95),
        "p99_ms": _pct(lat, 99),
        "local": local,
        "fallbacks": sum(1 for r in ok if r[FALLBACK]),
        "by_server": by_server,
        "server_util": {a: cpu_s[a] / (duration * limit) if duration > 0 and limit > 0 else math.nan for a in servers},
        "after_kill_on_killed": sum(k["after_kill_on_killed"] for k in kills),
        "after_kill_on_others": sum(k["after_kill_on_others"] for k in kills),
        "moved": sum(k["moved"] for k in kills),
        "accounted": len(ok) == local + sum(by_server.values()),
        "plans": dict(sorted(plans.items(), key=lambda kv: -kv[1])),
        "by_plan": plan_breakdown(ok),
        "segments": len(segments),
        "duration_s": duration,
    }


def compare(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], *, n: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """95 % bootstrap intervals of a / b (throughput, mean and p95 latency), resampling (segment,
    device) groups; ``call`` says better/worse only when the interval excludes 1."""
    ga, gb = groups(a), groups(b)

    def lats(gs: list[list[list[Any]]]) -> list[list[float]]:
        return [[float(r[LATENCY_MS]) for r in g if not r[ERROR]] for g in gs]

    def counts(gs: list[list[list[Any]]]) -> list[list[float]]:
        return [[float(sum(1 for r in g if not r[ERROR]))] for g in gs]

    out: dict[str, Any] = {}
    for key, xa, xb, stat in (
        ("throughput", counts(ga), counts(gb), "mean"),
        ("mean", lats(ga), lats(gb), "mean"),
        ("p95", lats(ga), lats(gb), "p95"),
    ):
        ci = bootstrap_ratio(xa, xb, n=n, seed=seed, stat=stat)
        out[key] = {"ci": list(ci), "call": call(ci) if not math.isnan(ci[0]) else "n/a"}
    # Higher throughput is better: flip the call so "better" always means better for a.
    flip = {"better": "worse", "worse": "better"}
    out["throughput"]["call"] = flip.get(out["throughput"]["call"], out["throughput"]["call"])
    return out


def verdict(
    strategies: Mapping[str, Mapping[str, Any]], comparisons: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The issue's acceptance line: adaptive has the highest throughput, at a p95 equal to (the bootstrap
    interval of the ratio holds 1) or better than every fixed strategy's, and no strategy failed or lost
    a request (the kill included)."""
    a = strategies.get("adaptive")
    others = {n: s for n, s in strategies.items() if n != "adaptive"}
    if a is None or not others:
        return {"pass": False, "reasons": ["needs adaptive and at least one other strategy"], "failed": 0}
    reasons = []
    for name, s in others.items():
        if not a["throughput_rps"] > s["throughput_rps"]:
            reasons.append(f"throughput {a['throughput_rps']:.2f} req/s not above {name}'s {s['throughput_rps']:.2f}")
        p95_call = (comparisons or {}).get(name, {}).get("p95", {}).get("call")
        if not a["p95_ms"] <= s["p95_ms"] and p95_call != "same":
            reasons.append(f"p95 {a['p95_ms']:.0f} ms above {name}'s {s['p95_ms']:.0f} ms")
    failed = sum(int(s["failed"]) for s in strategies.values())
    if failed:
        reasons.append(f"{failed} failed request(s)")
    lost = [n for n, s in strategies.items() if not s["accounted"] or s["after_kill_on_killed"]]
    if lost:
        reasons.append(f"requests unaccounted or served by the killed server: {', '.join(lost)}")
    return {"pass": not reasons, "reasons": reasons, "failed": failed}
