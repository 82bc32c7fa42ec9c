"""Replaying a decision log (pure): ``replay(lines, table | tables, config) -> [(logged, replayed)]`` feeds the
lines back through a fresh ``Controller`` and must reproduce every decision (``plan.controller``'s
contract: every ``Decision`` holds all its inputs)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from splitrt.plan.controller import ROUTE_CODEC, Controller, ControllerConfig, route_codec_config, route_config
from splitrt.plan.correction import Observation
from splitrt.plan.costmodel import DEFAULT_POWER, CostTable, Power
from splitrt.plan.decision import Decision
from splitrt.plan.netmon import LinkEstimate, LoadEstimate

__all__ = ["replay"]


def replay(
    lines: Iterable[str],
    table: CostTable | Sequence[CostTable],
    config: ControllerConfig | None = None,
    *,
    power: Power = DEFAULT_POWER,
    model: str | None = None,
) -> list[tuple[Decision, Decision]]:
    """Re-run a decision log through a fresh controller: pairs of (logged, replayed) decisions.

    Lines are taken in decision order (``seq``). The corrections are rebuilt from the observations the
    lines carry (``extra["observed"]``: index, plan, predicted_ms, measured_ms, t_s), each decision
    replayed after as many as it had seen (``Decision.seen``). A decision a fixed or periodic policy imposed
    (reason ``policy ...``) is not the controller's: replay adopts it as the plan in use and goes on.
    ``model`` (a sha256 prefix) picks one model's lines from a daemon's shared log. A log whose
    decisions carry ``extra["policy"] == "route"`` replays under ``route_config(config)``, ``"route-codec"``
    under ``route_codec_config``.
    """
    ctl = Controller(table, config, power=power)
    logged_all = sorted((Decision.from_json(line) for line in lines if line.strip()), key=lambda d: d.seq)
    if model is not None:
        logged_all = [d for d in logged_all if str(d.extra.get("model", "")).startswith(model[:16])]
    if any(d.extra.get("policy") == "route" for d in logged_all):
        ctl.config = route_config(ctl.config)
    if any(d.extra.get("policy") == ROUTE_CODEC for d in logged_all):
        ctl.config = route_codec_config(ctl.config, ctl.table.codecs)
    observed = _observations(logged_all)
    pairs = []
    for logged in logged_all:
        while ctl.corrections.seen < min(logged.seen, len(observed)):  # what it had learnt when it decided
            ctl.observe(observed[ctl.corrections.seen])
        if logged.reason.startswith("policy "):
            ctl.current = logged.plan
            ctl.live = (0, *[t + 1 for t, u in enumerate(logged.up) if u])
            pairs.append((logged, logged))
            continue
        again = ctl.decide(
            logged.t_s,
            [
                LinkEstimate(bandwidth_mbps=b, rtt_ms=r, confidence=c)
                for b, r, c in zip(logged.link_mbps, logged.link_rtt_ms, logged.link_confidence, strict=True)
            ],
            [
                LoadEstimate(device_factor=logged.loads[0], cloud_factor=cf, queue_ms=w)
                for cf, w in zip(logged.loads[1:], logged.waits_ms, strict=True)
            ],
            cloud_available=logged.up,
            request=logged.request,
        )
        pairs.append((logged, again))
    return pairs


def _observations(logged: Sequence[Decision]) -> list[Observation]:
    """The observations the log's lines carry (``extra["observed"]``), in the order they were fed."""
    found = {}
    for d in logged:
        o = d.extra.get("observed")
        if isinstance(o, dict):
            found[int(o["index"])] = Observation.from_json(o)
    return [found[i] for i in sorted(found)]
