"""A profile's cost table at the binding a plan asks for (``plan --dim/--shape/--sample``).

A profile is measured at one input-shape signature (recorded as ``model.input_shapes``); a plan may be
asked at another. Pricing the profile's shape under the plan's name would be silently wrong, so the
table is re-priced at the plan's shapes with the scaling the runtime already applies per request shape
(``plan.reshape.scale_table`` on ``graph.rebind.cut_costs_at``: bytes exact at the new shapes, each
side's time scaled by its FLOPs), and the result says so. When that cannot be done (the profile does
not record its shapes and the model has free dims, or the graph does not re-bind at the profile's
shapes) it is a ``ProfileError`` naming both shapes.

``splitrt.profile.reprice``: ``table_at(graph, device, cloud, table) -> (CostTable, Pricing)``: ``plan`` at a
binding other than the profiles' (``model.input_shapes``) re-priced with ``scale_table`` (below), said in
``Pricing.note`` / ``.as_dict()`` (``plan --json`` key ``shapes``); ``ProfileError`` naming both shapes when a
profile of a model with free dims does not record its shapes. ``splitrt.profile.sanity.implausible(profile)`` /
``.warning(profile, label)``: heads or tails dearer than the whole model, a bigger head cheaper than a smaller
one it contains (beyond 10 % of the whole model), named by cut (``profile``, ``plan``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from splitrt.errors import ModelError, PlanError, ProfileError
from splitrt.graph import rebind
from splitrt.graph.model import ModelGraph
from splitrt.plan import reshape
from splitrt.plan.costmodel import CostTable
from splitrt.profile.store import Profile

Shapes = dict[str, tuple[int, ...]]


def fmt_shapes(shapes: Mapping[str, Sequence[int]] | None) -> str:
    """``x=1x3x640x640, y=1x4`` (a scalar is ``sr=``); ``unknown`` for None."""
    if shapes is None:
        return "unknown (not recorded in the profile)"
    return ", ".join(f"{k}=" + "x".join(str(d) for d in v) for k, v in sorted(shapes.items()))


@dataclass(frozen=True, kw_only=True)
class Pricing:
    """Where the plan's table was priced: the plan's shapes, each profile's, and whether re-priced."""

    planned: Shapes
    device: Shapes
    cloud: Shapes
    repriced: bool

    @property
    def note(self) -> str:
        if not self.repriced:
            return f"priced at {fmt_shapes(self.planned)}, the shapes the profiles were measured at"
        at = (
            fmt_shapes(self.device)
            if self.device == self.cloud
            else f"device {fmt_shapes(self.device)}, cloud {fmt_shapes(self.cloud)}"
        )
        return (
            f"priced at {fmt_shapes(self.planned)}: the profiles were measured at {at}, re-priced by "
            "FLOPs scaling per side of each cut (bytes exact at the new shapes; times an estimate: "
            "profile at this binding for measured ones)"
        )

    def as_dict(self) -> dict[str, Any]:
        def js(s: Shapes) -> dict[str, list[int]]:
            return {k: list(v) for k, v in sorted(s.items())}

        return {
            "planned": js(self.planned),
            "device_profile": js(self.device),
            "cloud_profile": js(self.cloud),
            "repriced": self.repriced,
            "method": "plan.reshape.scale_table" if self.repriced else "as profiled",
            "note": self.note,
        }


def profile_shapes(profile: Profile, graph: ModelGraph) -> Shapes | None:
    """The input shapes ``profile`` was measured at: recorded, else the model's own when every input
    dim is fixed (profiles of static models made before shapes were recorded), else None."""
    recorded = profile.model.get("input_shapes")
    if isinstance(recorded, dict):
        return {str(k): tuple(int(d) for d in v) for k, v in recorded.items()}
    fixed: Shapes = {}
    for t in graph.inputs:
        dims = graph.generic_shape(t.name)
        if dims is None or not all(isinstance(d, int) and d > 0 for d in dims):
            return None
        fixed[t.name] = tuple(d for d in dims if isinstance(d, int))
    return fixed


def _refuse(name: str, planned: Shapes, measured: Shapes | None, why: str) -> ProfileError:
    return ProfileError(
        f"cannot re-price the {name} profile for this plan: the plan is at {fmt_shapes(planned)}, "
        f"the profile was measured at {fmt_shapes(measured)}: {why}. Profile at the plan's "
        "binding (splitrt profile ... with the same --shape/--dim/--sample), or plan at the "
        "profile's"
    )


def table_at(graph: ModelGraph, device: Profile, cloud: Profile, table: CostTable) -> tuple[CostTable, Pricing]:
    """``table`` (built from ``device`` and ``cloud``) priced at ``graph``'s bound input shapes."""
    if graph.input_shapes is None:
        raise ProfileError(f"{graph.path.name}: expected a graph bound at the plan's shapes, got an unbound one")
    planned: Shapes = {k: tuple(v) for k, v in graph.input_shapes.items()}
    measured: dict[str, Shapes] = {}
    for name, prof in (("device", device), ("cloud", cloud)):
        shapes = profile_shapes(prof, graph)
        if shapes is None:
            raise _refuse(
                name,
                planned,
                None,
                "the model has free dims and the profile does not say which shapes it was measured at",
            )
        measured[name] = shapes
    pricing = Pricing(
        planned=planned,
        device=measured["device"],
        cloud=measured["cloud"],
        repriced=any(reshape.signature(s) != reshape.signature(planned) for s in measured.values()),
    )
    if not pricing.repriced:
        return table, pricing
    scaled: dict[str, CostTable] = {}
    for name, shapes in measured.items():
        try:
            at_a = rebind.cut_costs_at(graph, shapes)
            at_b = rebind.cut_costs_at(graph, planned, sample=graph.binding.sample if graph.binding else None)
            scaled[name] = (
                reshape.scale_table(table, at_a, at_b) if shapes != planned else reshape.scale_table(table, at_b, at_b)
            )
        except (ModelError, PlanError) as exc:
            raise _refuse(name, planned, shapes, str(exc)) from exc
    return CostTable.joined(scaled["device"], scaled["cloud"]), pricing
