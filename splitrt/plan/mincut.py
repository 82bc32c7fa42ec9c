"""DADS-style optimal partition of a DAG by s-t minimum cut (pure: no I/O, no clocks).

Candidate cuts (``splitrt.graph``) are topological prefixes; a DAG with parallel branches has many
more valid heads (every down-closed node set). Under the additive model — per-node device and cloud
times, a transfer cost per crossing tensor, one RTT when anything goes to the cloud — the best head
over *all* down-closed sets is a minimum s-t cut (Hu et al., "Dynamic Adaptive DNN Surgery",
INFOCOM 2019) of this network:

* ``s → v`` with capacity cloud_ms(v) (cut when v runs on the cloud), ``v → t`` with device_ms(v);
* per tensor x produced by p: ``p → x`` with its transfer time, ``x → w`` = ∞ for every consumer w
  (so a tensor is paid once however many cloud consumers it has); a graph output also gets
  ``x → t`` = ∞ (it always travels unless everything stays on the device, handled separately);
  a graph input gets ``s → x`` with its transfer time;
* ``w → p`` = ∞ for every data edge p → w: a head never depends on the tail.

Max-flow is Dinic's algorithm on plain Python lists (a few ms for ~1000 nodes); no networkx needed.

- ``mincut.best_head(Dag, cond) -> HeadChoice(head, latency_ms, crossing_bytes)``: DADS min-cut over all
  down-closed node sets (additive per-node model, fp32); ``profiler.dag(graph, dev, cloud)`` builds the Dag.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from splitrt.errors import PlanError
from splitrt.plan.costmodel import MS_PER_BYTE_AT_1MBPS, Conditions


@dataclass(frozen=True, kw_only=True)
class DagTensor:
    """A tensor of the DAG: its bytes, producing node (-1 for a graph input) and consuming nodes."""

    name: str
    bytes: int
    producer: int
    consumers: tuple[int, ...]
    is_output: bool = False


@dataclass(frozen=True, kw_only=True)
class Dag:
    """Per-node costs (nodes in topological order) and the tensors between them."""

    device_ms: tuple[float, ...]
    cloud_ms: tuple[float, ...]
    tensors: tuple[DagTensor, ...]

    def __post_init__(self) -> None:
        n = len(self.device_ms)
        if len(self.cloud_ms) != n:
            raise PlanError(f"device_ms has {n} nodes but cloud_ms has {len(self.cloud_ms)}")
        for t in self.tensors:
            if not -1 <= t.producer < n or any(not 0 <= w < n for w in t.consumers):
                raise PlanError(f"tensor {t.name!r} refers to a node outside 0..{n - 1}")
            if any(w <= t.producer for w in t.consumers):
                raise PlanError(f"tensor {t.name!r}: nodes must be in topological order")

    @property
    def n(self) -> int:
        return len(self.device_ms)

    def predecessors(self) -> list[set[int]]:
        preds: list[set[int]] = [set() for _ in range(self.n)]
        for t in self.tensors:
            if t.producer >= 0:
                for w in t.consumers:
                    preds[w].add(t.producer)
        return preds

    @property
    def reply_bytes(self) -> int:
        return sum(t.bytes for t in self.tensors if t.is_output)


@dataclass(frozen=True, kw_only=True)
class HeadChoice:
    head: frozenset[int]  # node indices that run on the device
    latency_ms: float
    crossing_bytes: int


def crossing(dag: Dag, head: frozenset[int]) -> list[DagTensor]:
    """Tensors that cross for this head (nothing when the head is the whole graph)."""
    if len(head) == dag.n:
        return []
    out = []
    for t in dag.tensors:
        on_device = t.producer < 0 or t.producer in head
        if on_device and (t.is_output or any(w not in head for w in t.consumers)):
            out.append(t)
    return out


def is_down_closed(dag: Dag, head: frozenset[int]) -> bool:
    preds = dag.predecessors()
    return all(preds[v] <= head for v in head)


def head_latency_ms(dag: Dag, head: frozenset[int], cond: Conditions) -> float:
    """Additive-model latency of running ``head`` on the device and the rest on the cloud."""
    device = sum(dag.device_ms[v] for v in head) * cond.device_load
    if len(head) == dag.n:
        return device
    cloud = sum(dag.cloud_ms[v] for v in range(dag.n) if v not in head) * cond.cloud_load
    sent = sum(t.bytes for t in crossing(dag, head))
    link = (sent + dag.reply_bytes) * MS_PER_BYTE_AT_1MBPS / cond.link.bandwidth_mbps
    return device + cloud + link + cond.link.rtt_ms


def down_closed_sets(dag: Dag, limit: int = 1 << 16) -> Iterator[frozenset[int]]:
    """Every down-closed node set (for checking on small DAGs); PlanError beyond ``limit`` sets."""
    preds = dag.predecessors()
    count = 0

    def rec(v: int, head: frozenset[int]) -> Iterator[frozenset[int]]:
        nonlocal count
        if v == dag.n:
            count += 1
            if count > limit:
                raise PlanError(f"more than {limit} down-closed sets; enumeration is for small DAGs")
            yield head
            return
        yield from rec(v + 1, head)
        if preds[v] <= head:
            yield from rec(v + 1, head | {v})

    yield from rec(0, frozenset())


def best_by_enumeration(dag: Dag, cond: Conditions) -> HeadChoice:
    best: HeadChoice | None = None
    for head in down_closed_sets(dag):
        lat = head_latency_ms(dag, head, cond)
        if best is None or lat < best.latency_ms:
            best = HeadChoice(head=head, latency_ms=lat, crossing_bytes=sum(t.bytes for t in crossing(dag, head)))
    assert best is not None
    return best


class _FlowNetwork:
    """Dinic's max-flow; edges stored in flat lists (to, capacity), paired as e and e ^ 1."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.adj: list[list[int]] = [[] for _ in range(n)]
        self.to: list[int] = []
        self.cap: list[float] = []

    def add(self, u: int, v: int, cap: float) -> None:
        self.adj[u].append(len(self.to))
        self.to.append(v)
        self.cap.append(cap)
        self.adj[v].append(len(self.to))
        self.to.append(u)
        self.cap.append(0.0)

    def max_flow(self, s: int, t: int, eps: float) -> float:
        total = 0.0
        adj, to, cap = self.adj, self.to, self.cap
        while True:
            level = [-1] * self.n
            level[s] = 0
            q = deque([s])
            while q:
                u = q.popleft()
                for e in adj[u]:
                    if cap[e] > eps and level[to[e]] < 0:
                        level[to[e]] = level[u] + 1
                        q.append(to[e])
            if level[t] < 0:
                return total
            it = [0] * self.n
            while True:  # blocking flow, iterative DFS
                path: list[int] = []
                u = s
                while u != t:
                    advanced = False
                    while it[u] < len(adj[u]):
                        e = adj[u][it[u]]
                        v = to[e]
                        if cap[e] > eps and level[v] == level[u] + 1:
                            path.append(e)
                            u = v
                            advanced = True
                            break
                        it[u] += 1
                    if not advanced:
                        if u == s:
                            break
                        level[u] = -1  # dead end: prune
                        e = path.pop()
                        u = to[e ^ 1]
                        it[u] += 1
                if u != t:
                    break
                push = min(cap[e] for e in path)
                if math.isinf(push):
                    raise PlanError("unbounded flow: the DAG has an infinite-cost path")
                for e in path:
                    cap[e] -= push
                    cap[e ^ 1] += push
                total += push

    def source_side(self, s: int, eps: float) -> set[int]:
        seen = {s}
        q = deque([s])
        while q:
            u = q.popleft()
            for e in self.adj[u]:
                v = self.to[e]
                if self.cap[e] > eps and v not in seen:
                    seen.add(v)
                    q.append(v)
        return seen


def best_head(dag: Dag, cond: Conditions) -> HeadChoice:
    """The best down-closed head under the additive model (DADS min-cut), compared with all-device."""
    n = dag.n
    dl, cl = cond.device_load, cond.cloud_load
    per_byte = MS_PER_BYTE_AT_1MBPS / cond.link.bandwidth_mbps
    tensors = [t for t in dag.tensors if t.consumers or t.is_output]
    s, t_node = n + len(tensors), n + len(tensors) + 1
    net = _FlowNetwork(n + len(tensors) + 2)
    inf = math.inf
    scale = 0.0
    for v in range(n):
        net.add(s, v, dag.cloud_ms[v] * cl)
        net.add(v, t_node, dag.device_ms[v] * dl)
        scale += dag.cloud_ms[v] * cl + dag.device_ms[v] * dl
    for k, ten in enumerate(tensors):
        x = n + k
        cost = ten.bytes * per_byte
        scale += cost
        net.add(s if ten.producer < 0 else ten.producer, x, cost)
        for w in ten.consumers:
            net.add(x, w, inf)
            if ten.producer >= 0:
                net.add(w, ten.producer, inf)
        if ten.is_output:
            net.add(x, t_node, inf)
    eps = max(scale, 1.0) * 1e-12
    net.max_flow(s, t_node, eps)
    head = frozenset(v for v in net.source_side(s, eps) if v < n)
    candidates = [head, frozenset(range(n))]
    best: HeadChoice | None = None
    for h in candidates:
        lat = head_latency_ms(dag, h, cond)
        if best is None or lat < best.latency_ms:
            best = HeadChoice(head=h, latency_ms=lat, crossing_bytes=sum(x.bytes for x in crossing(dag, h)))
    assert best is not None
    return best


def prefix_head(n_head: int) -> frozenset[int]:
    return frozenset(range(n_head))


def best_prefix(dag: Dag, cond: Conditions, prefixes: Sequence[int] | None = None) -> HeadChoice:
    """Best head among topological prefixes (the candidate cuts of ``splitrt.graph``)."""
    best: HeadChoice | None = None
    for k in range(dag.n + 1) if prefixes is None else prefixes:
        h = prefix_head(k)
        lat = head_latency_ms(dag, h, cond)
        if best is None or lat < best.latency_ms:
            best = HeadChoice(head=h, latency_ms=lat, crossing_bytes=sum(x.bytes for x in crossing(dag, h)))
    assert best is not None
    return best
