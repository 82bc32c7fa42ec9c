"""The rig's strategies, one set for every topology, and the runtime policy each runs (pure: tables and
link figures in, policies out; no sockets, sessions, files or clocks).

Over the direct path (the two-tier runtime, ``AdaptiveDevice``): ``device-only``, ``cloud-only``,
``static`` (the profile's best plan at the links' median bandwidth; in three tiers it is named
``static-2tier``), ``static-fixed`` (the same at the trace family's median, whatever the scale: ONE choice
across a grid), ``periodic`` (re-plans every ``periodic_s``), ``route`` (adaptive restricted to the cuts
device and cloud: whole-request routing), ``route-codec`` (routing that sends the input under the best
allowed image codec, as a camera router sends a JPEG) and ``adaptive`` (``adaptive-2tier`` in three tiers). Through the
edge (``AdaptiveDevice`` over the three tiers): ``edge-only`` (the edge runs the whole model), ``static-3tier``
(the best cut pair at the hops' medians, the runtime's ``fixed:PLAN``) and ``adaptive``. ``adaptive-hold``
(two tiers) is adaptive whose hysteresis holds any gain within its margin for good
(``ControllerConfig.hold_drift_fraction`` 0, the controller before gains that persist added up): the
before of that change, side by side in one run (``HOLD_ABLATION``); ``adaptive-keep`` is adaptive whose
link estimate keeps a lone slow sample (``LinkConfig.forgive_slow_s`` None, ``SLOW_ABLATION``); ``adaptive-news``
is adaptive whose link estimate takes a lone slow sample at the newest sample's weight (``LinkConfig.confirm_slow``
False, ``NEWS_ABLATION``). ``oracle`` and
``oracle-route`` are computed afterwards over the ``adaptive`` / ``route`` run's request times (two tiers).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from splitrt.errors import ConfigError
from splitrt.plan.costmodel import DEFAULT_POWER, DEVICE_CUT, Conditions, CostTable, Link, Power
from splitrt.plan.path import PathConditions, solve_path
from splitrt.plan.solver import solve

STRATEGIES = (
    "device-only",
    "cloud-only",
    "static",
    "static-2tier",
    "static-fixed",
    "periodic",
    "edge-only",
    "static-3tier",
    "route",
    "route-codec",
    "adaptive-2tier",
    "adaptive",
    "adaptive-hold",
    "adaptive-keep",
    "adaptive-news",
    "oracle",
    "oracle-route",
)
ORACLE_REFS = {"oracle": "adaptive", "oracle-route": "route"}
ONLY_TWO = (
    "static",
    "oracle",
    "oracle-route",
    "static-fixed",
    "adaptive-hold",
)  # two tiers: the direct path is the path
ONLY_THREE = ("static-2tier", "edge-only", "static-3tier", "adaptive-2tier")
#: The ablation strategy: adaptive with ``ControllerConfig(hold_drift_fraction=0)`` (the worker sets it).
HOLD_ABLATION = "adaptive-hold"
#: The ablation strategy: adaptive with ``LinkConfig(forgive_slow_s=None)`` (the worker sets it).
SLOW_ABLATION = "adaptive-keep"
#: The ablation strategy: adaptive with ``LinkConfig(confirm_slow=False)`` (the worker sets it).
NEWS_ABLATION = "adaptive-news"
FIXED = ("device-only", "cloud-only", "static", "static-2tier", "static-fixed", "edge-only", "static-3tier")


def check(names: Sequence[str], tiers: int) -> None:
    """Refuse names unknown or not applying to ``tiers`` tiers, naming what does."""
    ok = [n for n in STRATEGIES if n not in (ONLY_THREE if tiers == 2 else ONLY_TWO)]
    bad = [n for n in names if n not in ok]
    if bad or not names:
        raise ConfigError(f"strategies: expected names in {', '.join(ok)} ({tiers} tiers), got {list(names)}")


@dataclass(frozen=True, kw_only=True)
class Choice:
    """How a strategy runs: on ``tiers`` tiers (2: the direct path), with ``policy``."""

    name: str
    tiers: int
    policy: str

    @property
    def plan(self) -> str | None:
        return self.policy.split(":", 1)[1] if self.policy.startswith("fixed:") else None


def direct(hops: Sequence[Link]) -> Link:
    """The direct path is the hops in series: the narrowest bandwidth, every round trip."""
    return Link(bandwidth_mbps=min(h.bandwidth_mbps for h in hops), rtt_ms=sum(h.rtt_ms for h in hops))


def choose(
    names: Sequence[str],
    tables: Sequence[CostTable],
    hops: Sequence[Link],
    *,
    fixed_mbps: float,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] | None = None,
    periodic_s: float = 5.0,
) -> dict[str, Choice]:
    """The measured strategies of ``names`` (oracles are computed, not run); ``tables``: device, then one
    per server tier; ``hops``: each hop at its median; ``fixed_mbps``: the bandwidth of ``static-fixed``."""
    check(names, len(tables))
    cs = list(codecs) if codecs else None
    link = direct(hops)

    def best(mbps: float, cuts: Sequence[str] | None = None) -> str:
        cond = Conditions(link=replace(link, bandwidth_mbps=mbps))
        return solve(tables[0], cond, objective=objective, power=power, codecs=cs, cuts=cuts).key

    def policy(name: str) -> str:
        if name in ("static", "static-2tier", "static-fixed", "cloud-only"):
            mbps = {"static-fixed": fixed_mbps, "cloud-only": 1.0}.get(name, link.bandwidth_mbps)
            return f"fixed:{best(mbps, ['cloud'] if name == 'cloud-only' else None)}"
        if name == "static-3tier":
            cond = PathConditions(hops=tuple(hops), loads=(1.0,) * len(tables))
            return f"fixed:{solve_path(tables, cond, objective=objective, power=power, codecs=cs, same_codec=True).key}"
        simple = {
            "device-only": "fixed:device",
            "periodic": f"periodic:{periodic_s:g}",
            "route": "route",
            "route-codec": "route-codec",
        }
        return simple.get(
            name, f"fixed:cloud@{(cs or ['fp32'])[0]}>{DEVICE_CUT}" if name == "edge-only" else "adaptive"
        )

    chain = ("edge-only", "static-3tier", "adaptive") if len(tables) == 3 else ()
    return {n: Choice(name=n, tiers=3 if n in chain else 2, policy=policy(n)) for n in names if n not in ORACLE_REFS}


def likely_plans(
    tables: Sequence[CostTable],
    rtts_ms: Sequence[float],
    *,
    objective: str = "latency",
    power: Power = DEFAULT_POWER,
    codecs: Sequence[str] | None = None,
) -> tuple[list[str], list[str]]:
    """(device cuts, chain plans most frequent first) the solvers pick over bandwidths of every hop
    (0.05-1000 Mbit/s with one hop, 0.1-100 with two) and device/server loads 1-8: the sessions worth
    building before the timed part."""
    cs = list(codecs) if codecs else None
    one = len(tables) == 2
    grid = [0.05 * 10 ** (i / 8) for i in range(41)] if one else [0.1 * 10 ** (i / 4) for i in range(13)]
    cuts, pairs = {"device", "cloud"}, collections.Counter[str]()
    loads = itertools.product((1.0, 2.0, 4.0, 8.0), (1.0, 3.0, 8.0)) if one else itertools.product((1.0, 4.0), (1.0,))
    for bws, (dl, cl) in itertools.product(itertools.product(grid, repeat=1 if one else 2), list(loads)):
        hops = [Link(bandwidth_mbps=b, rtt_ms=r) for b, r in zip(bws, rtts_ms, strict=True)]
        cond = Conditions(link=direct(hops), device_load=dl, cloud_load=cl)
        cuts.add(solve(tables[0], cond, objective=objective, power=power, codecs=cs).cut)
        if not one:
            cc = PathConditions(hops=tuple(hops), loads=(dl, 1.0, 1.0))
            cp = solve_path(tables, cc, objective=objective, power=power, codecs=cs, same_codec=True)
            cuts.add(cp.cuts[0])
            if cp.cuts[0] != DEVICE_CUT:
                pairs[cp.key] += 1
    return sorted(cuts), [k for k, _ in pairs.most_common()]
