"""Who gets the next worker: start-time fair queuing (Goyal, Vin and Cheng, 1996) of the worker slots per
client, each job charged the worker-seconds it holds, as consumed (running jobs included); an idle client
starts level. Caps: one client holds at most ``ceil(workers / active clients)`` workers, ``HEAVY`` jobs
at most ``heavy_workers``; ``over_share`` marks runs that yield the CPU (``niced``). Pure: no locks,
clocks or I/O (``admission.Admission`` drives it with ``now_s``). The design: docs/operator/server.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["HEAVY", "RUN", "FairConfig", "FairQueue"]

RUN = "run"  # a tail (or middle segment) running a request
HEAVY = "heavy"  # a tail build (or other work in a slot that is not a request's run)

# Idle clients remembered at most (those with virtual time ahead of the system's; the rest start level).
MAX_REMEMBERED = 4096


@dataclass(frozen=True, kw_only=True)
class FairConfig:
    workers: int
    # Heavy jobs (builds) at once (None: all but one worker, at least one).
    heavy_workers: int | None = None
    # A client that asked within this is still counted active for the per-client cap.
    active_window_s: float = 1.0

    @property
    def heavy_cap(self) -> int:
        return self.heavy_workers if self.heavy_workers is not None else max(1, self.workers - 1)


@dataclass
class _Job:
    ticket: int
    client: str
    kind: str
    seq: int
    start_s: float = 0.0


@dataclass
class _Client:
    vt_s: float = 0.0  # worker-seconds charged for finished jobs (plus the level it started at)
    last_s: float = -math.inf  # when it last asked
    running: dict[int, _Job] = field(default_factory=dict)
    waiting: int = 0


class FairQueue:
    """Tickets arrive (``arrive``), are granted workers (``dispatch``) and finish (``finish``) or give
    up waiting (``cancel``). Every method takes ``now_s``, a monotonic time in seconds."""

    def __init__(self, config: FairConfig) -> None:
        if config.workers < 1 or config.heavy_cap < 1 or config.active_window_s < 0:
            raise ValueError(f"workers >= 1, heavy_workers >= 1, active_window_s >= 0 expected, got {config}")
        self.config = config
        self.clients: dict[str, _Client] = {}
        self.waiting: list[_Job] = []  # arrival order
        self.running: dict[int, _Job] = {}
        self.heavy_running = 0
        self.vt_s = 0.0  # the system's virtual time: never decreases
        self._seq = 0

    # -- events ------------------------------------------------------------------------------------
    def arrive(self, ticket: int, client: str, kind: str, now_s: float) -> None:
        if kind not in (RUN, HEAVY):
            raise ValueError(f"kind: expected {RUN!r} or {HEAVY!r}, got {kind!r}")
        if ticket in self.running or (self.waiting and any(j.ticket == ticket for j in self.waiting)):
            raise ValueError(f"ticket {ticket} already queued or running")
        c = self.clients.get(client)
        if c is None:
            c = self.clients[client] = _Client(vt_s=self._level(now_s))
        elif not c.running and not c.waiting:
            c.vt_s = max(c.vt_s, self._level(now_s))  # idle time banks no credit
        c.last_s = now_s
        c.waiting += 1
        self._seq += 1
        self.waiting.append(_Job(ticket, client, kind, self._seq))

    def cancel(self, ticket: int, now_s: float) -> bool:
        """A waiting ticket gave up (its deadline passed); False if it was not waiting."""
        for i, job in enumerate(self.waiting):
            if job.ticket == ticket:
                del self.waiting[i]
                self.clients[job.client].waiting -= 1
                self._forget(now_s)
                return True
        return False

    def finish(self, ticket: int, now_s: float) -> float:
        """A granted ticket released its worker: its client is charged the seconds it held it (returned)."""
        job = self.running.pop(ticket)
        c = self.clients[job.client]
        del c.running[ticket]
        held = max(0.0, now_s - job.start_s)
        c.vt_s += held
        if job.kind == HEAVY:
            self.heavy_running -= 1
        self._forget(now_s)
        return held

    def dispatch(self, now_s: float) -> list[int]:
        """Grant free workers to waiting tickets, fairest first; returns the tickets granted now."""
        granted: list[int] = []
        while len(self.running) < self.config.workers and self.waiting:
            job = self._pick(now_s)
            if job is None:
                break
            self.waiting.remove(job)
            c = self.clients[job.client]
            c.waiting -= 1
            job.start_s = now_s
            c.running[job.ticket] = job
            self.running[job.ticket] = job
            if job.kind == HEAVY:
                self.heavy_running += 1
            granted.append(job.ticket)
        return granted

    # -- views -------------------------------------------------------------------------------------
    def virtual_s(self, client: str, now_s: float) -> float:
        """A client's virtual time now: charged seconds plus what its running jobs have held so far."""
        c = self.clients.get(client)
        if c is None:
            return self._level(now_s)
        return _vt(c, now_s)

    def active(self, now_s: float) -> int:
        w = self.config.active_window_s
        n = 0
        for c in self.clients.values():  # a loop, not sum(<genexpr>): per dispatch
            if c.running or c.waiting or now_s - c.last_s <= w:
                n += 1
        return n

    def over_share(self, client: str, now_s: float) -> bool:
        """The client wants more workers than it holds (jobs waiting) while another client is active: its
        runs yield the CPU to the others' (``admission.Admission.yielding``). A lone client never does."""
        c = self.clients.get(client)
        return c is not None and c.waiting > 0 and self.active(now_s) > 1

    def client_cap(self, now_s: float) -> int:
        """Workers one client may hold now."""
        return max(1, math.ceil(self.config.workers / max(1, self.active(now_s))))

    # -- internals ---------------------------------------------------------------------------------
    def _pick(self, now_s: float) -> _Job | None:
        cap = self.client_cap(now_s)
        heavy_full = self.heavy_running >= self.config.heavy_cap
        best: tuple[float, int] | None = None
        chosen: _Job | None = None
        vts: dict[str, float] = {}
        for job in self.waiting:
            if heavy_full and job.kind == HEAVY:
                continue
            if len(self.clients[job.client].running) >= cap:
                continue
            vt = vts.get(job.client)
            if vt is None:
                vt = vts[job.client] = self.virtual_s(job.client, now_s)
            key = (vt, job.seq)
            if best is None or key < best:
                best, chosen = key, job
        return chosen

    def _level(self, now_s: float) -> float:
        """The system's virtual time: the least virtual time among busy clients (kept monotone)."""
        least: float | None = None
        for c in self.clients.values():
            if c.running or c.waiting:
                vt = _vt(c, now_s)
                if least is None or vt < least:
                    least = vt
        if least is not None:
            self.vt_s = max(self.vt_s, least)
        return self.vt_s

    def _forget(self, now_s: float) -> None:
        """Drop idle clients that would start level anyway, and the oldest beyond ``MAX_REMEMBERED``."""
        level = self._level(now_s)
        w = self.config.active_window_s
        gone = []
        for k, c in self.clients.items():
            if not c.running and not c.waiting and c.vt_s <= level and now_s - c.last_s > w:
                gone.append(k)
        for k in gone:
            del self.clients[k]
        if len(self.clients) > MAX_REMEMBERED:
            idle = sorted((c.last_s, k) for k, c in self.clients.items() if not c.running and not c.waiting)
            for _, k in idle[: len(self.clients) - MAX_REMEMBERED]:
                del self.clients[k]


def _vt(c: _Client, now_s: float) -> float:
    """``c``'s virtual time now (``FairQueue.virtual_s``); an idle client's is its charge, no sum made."""
    if not c.running:
        return c.vt_s
    return c.vt_s + sum(max(0.0, now_s - j.start_s) for j in c.running.values())
