"""The graph facts the deployment constraints need (``plan.constraints``), per cut of a cost table."""

from __future__ import annotations

from typing import Any

from splitrt.errors import ConfigError
from splitrt.graph import memory
from splitrt.plan.constraints import Allowed, Constraints, CutFacts, allowed_cuts


def cut_facts(mg: Any, ids: list[str] | tuple[str, ...] | None = None) -> CutFacts:
    """Head FLOPs share, raw-input crossing and head memory of every cut (``ids``: in this order)."""
    cuts = mg.cuts()
    by_id = {c.id: c for c in cuts}
    order = list(ids) if ids is not None else [c.id for c in cuts]
    missing = [i for i in order if i not in by_id]
    if missing:
        raise ConfigError(f"{mg.path}: the cost table's cuts {missing[:3]} are not cuts of this model")
    chosen = [by_id[i] for i in order]
    return CutFacts(
        ids=tuple(order),
        head_flops_fraction=tuple(c.head_flops_fraction for c in chosen),
        sends_input=tuple(memory.sends_input(mg, chosen)),
        head_memory_bytes=tuple(memory.head_memory_bytes(mg, chosen)),
        input_layout=tuple(memory.input_layout(mg, chosen)),
    )


def allowed_for(mg: Any, table: Any, constraints: Constraints) -> Allowed | None:
    """The table's cuts (None: the graph's) meeting ``constraints``, never a cut that only moves or
    reshapes the input (it is ``cloud``: ``plan.constraints.LAYOUT_OF_INPUT``); None when every cut is a
    candidate."""
    ids = [c.id for c in mg.cuts()] if table is None else list(table.ids)
    if not constraints.active:
        layout = memory.input_layout(mg, [c for c in mg.cuts() if c.id in set(ids)])
        if not any(layout):
            return None
    return allowed_cuts(cut_facts(mg, ids), constraints)


def memory_mb(value: str | float | None, board: Any) -> float | None:
    """``--device-memory-mb``: a number of MB, or ``board`` (the board file's ``memory_mb``)."""
    if value is None:
        return None
    if value == "board":
        if board is None:
            raise ConfigError("device memory: 'board' needs a board (--board NAME / board = ...), got none")
        return float(board.memory_mb)
    try:
        return float(value)
    except ValueError as exc:
        raise ConfigError(f"device memory: expected a number of MB or 'board', got {value!r}") from exc
