"""Per-shape plans of the adaptive runtime: a request-shape signature -> its cost tables (the profiled ones,
or scaled to the signature with ``plan.reshape``), its own controller and policy (``ShapePlan``). The
profiled signature's plan is pinned, the others kept in an LRU (``ShapePlans``); a new one is built once,
outside the lock requests at known shapes take.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from cachetools import Cache, LRUCache

from splitrt.errors import SplitrtError
from splitrt.graph import rebind
from splitrt.plan import reshape
from splitrt.plan.controller import Controller, Policy
from splitrt.plan.costmodel import CostTable
from splitrt.plan.reshape import Signature

__all__ = ["ShapePlan", "ShapePlans"]


@dataclass(frozen=True, kw_only=True)
class ShapePlan:
    """What one request-shape signature is planned with: its table, and its own controller and policy
    (so hysteresis at one shape is not disturbed by requests at another)."""

    signature: Signature
    tables: tuple[CostTable, ...]  # one per tier of the path (two tiers: the same table twice)
    controller: Controller
    policy: Policy
    source: str  # profiled | scaled | profiled (re-binding failed)

    @property
    def table(self) -> CostTable:
        """The device's table (its cuts, codecs and head times)."""
        return self.tables[0]


class ShapePlans:
    """A ``ShapePlan`` per signature: the profiled one pinned, the others in an LRU of ``size``. A new
    one is built once, under its own lock (re-binding the graph takes 10-100 ms: requests at known
    shapes must not wait for it)."""

    def __init__(
        self,
        graph: Any,
        tables: tuple[CostTable, ...],
        make: Callable[[tuple[CostTable, ...]], tuple[Controller, Policy]],
        *,
        profiled: Signature | None,
        size: int,
    ) -> None:
        self.graph, self.tables, self.make, self.size = graph, tables, make, size
        controller, policy = make(tables)
        self.profiled = ShapePlan(
            signature=profiled or (), tables=tables, controller=controller, policy=policy, source="profiled"
        )
        self.known = profiled is not None  # else the first request's signature is taken as the profiled one
        self.last = self.profiled
        self.built = 0
        self.last_error = ""
        self._others: LRUCache[Signature, ShapePlan] = LRUCache(maxsize=size)
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()

    def _held(self, sig: Signature) -> ShapePlan | None:
        if not self.known:
            self.known, self.profiled = True, replace(self.profiled, signature=sig)
        if sig == self.profiled.signature:
            return self.profiled
        return self._others.get(sig)  # a hit is the most recent again

    def get(self, sig: Signature, feeds: Mapping[str, np.ndarray]) -> ShapePlan:
        with self._lock:
            sp = self._held(sig)
            if sp is not None:
                self.last = sp
                return sp
        with self._build_lock:
            with self._lock:
                sp = self._others.get(sig)
            if sp is None:
                tables, source = self.tables_at(sig, feeds)
                controller, policy = self.make(tables)
                sp = ShapePlan(signature=sig, tables=tables, controller=controller, policy=policy, source=source)
                with self._lock:
                    self._others[sig] = sp  # the least recently used goes beyond ``size``
                    self.built += 1
            with self._lock:
                self.last = sp
            return sp

    def tables_at(
        self, sig: Signature, feeds: Mapping[str, np.ndarray] | None = None
    ) -> tuple[tuple[CostTable, ...], str]:
        """The profiled tables scaled to ``sig`` (``feeds``, of those shapes, size data-dependent tensors)."""
        if sig == self.profiled.signature:
            return self.tables, "profiled"
        try:
            at_a = rebind.cut_costs_at(self.graph, dict(self.profiled.signature))
            at_b = rebind.cut_costs_at(self.graph, dict(sig), sample=feeds)
            scaled: dict[int, CostTable] = {}  # a table shared by two tiers stays one object
            for t in self.tables:
                scaled.setdefault(id(t), reshape.scale_table(t, at_a, at_b))
            return tuple(scaled[id(t)] for t in self.tables), "scaled"
        except SplitrtError as exc:
            # Shapes the model's own shape inference cannot follow: plan with the profiled table
            # rather than fail a request the model itself accepts.
            self.last_error = f"{type(exc).__name__}: {exc}"
            return self.tables, "profiled (re-binding failed)"

    def snapshot(self) -> dict[Signature, ShapePlan]:
        with self._lock:
            # Cache.__getitem__: a read that leaves the LRU order alone (a status is not a use).
            others = {sig: Cache.__getitem__(self._others, sig) for sig in self._others}
            return {self.profiled.signature: self.profiled, **others}
