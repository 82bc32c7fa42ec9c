"""Fair queuing of worker slots (``cloud.capacity.fairq``), pure: random event sequences keep the invariants
(never more than the workers or the heavy lane, no worker idle while a job it may take waits, a grant
never puts a client over its cap, every ticket ends once), and simulated clients get what the
algorithm promises (a light client waits at most one heavy job however many are queued; two backlogged
clients' worker-seconds stay within a few job costs of each other)."""

from __future__ import annotations

import heapq
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitrt.cloud.capacity.fairq import HEAVY, MAX_REMEMBERED, RUN, FairConfig, FairQueue

CLIENTS = ["a", "b", "c", "d"]

op = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(CLIENTS), st.sampled_from([RUN, HEAVY])),
    st.tuples(st.just("finish"), st.integers(0, 50), st.just("")),
    st.tuples(st.just("cancel"), st.integers(0, 50), st.just("")),
    st.tuples(st.just("wait"), st.integers(1, 3000), st.just("")),
)


def _grantable(q: FairQueue, now: float) -> bool:
    """Is there a waiting job that a free worker could take now (by the caps)?"""
    if len(q.running) >= q.config.workers:
        return False
    cap = q.client_cap(now)
    heavy_free = q.heavy_running < q.config.heavy_cap
    return any((heavy_free or j.kind != HEAVY) and len(q.clients[j.client].running) < cap for j in q.waiting)


@settings(max_examples=300)
@given(
    workers=st.integers(1, 4),
    heavy=st.one_of(st.none(), st.integers(1, 3)),
    window_ms=st.integers(0, 2000),
    ops=st.lists(op, max_size=80),
)
def test_random_events_keep_the_invariants(
    workers: int, heavy: int | None, window_ms: int, ops: list[tuple[str, object, str]]
) -> None:
    q = FairQueue(FairConfig(workers=workers, heavy_workers=heavy, active_window_s=window_ms / 1e3))
    now, ticket = 0.0, 0
    arrived: set[int] = set()
    ended: set[int] = set()
    charged: dict[str, float] = {}
    for kind, x, y in ops:
        if kind == "arrive":
            ticket += 1
            q.arrive(ticket, str(x), y, now)
            arrived.add(ticket)
        elif kind == "finish" and q.running:
            t = sorted(q.running)[int(str(x)) % len(q.running)]
            client = q.running[t].client
            held = q.finish(t, now)
            assert held >= 0
            charged[client] = charged.get(client, 0.0) + held
            ended.add(t)
        elif kind == "cancel" and q.waiting:
            t = q.waiting[int(str(x)) % len(q.waiting)].ticket
            assert q.cancel(t, now)
            assert not q.cancel(t, now)  # once
            ended.add(t)
        elif kind == "wait":
            now += int(str(x)) / 1e3
        before = {k: len(c.running) for k, c in q.clients.items()}
        cap = q.client_cap(now)
        granted = q.dispatch(now)
        for t in granted:
            client = q.running[t].client
            assert before.get(client, 0) < cap, "a grant put a client over its cap"
            before[client] = before.get(client, 0) + 1
        assert len(q.running) <= workers
        assert q.heavy_running == sum(1 for j in q.running.values() if j.kind == HEAVY) <= q.config.heavy_cap
        assert not _grantable(q, now), "a worker is idle while a job it may take waits"
        live = set(q.running) | {j.ticket for j in q.waiting}
        assert live | ended == arrived and not live & ended
        assert q.vt_s >= 0
    # Every client still known was charged at least what its finished jobs held (plus its start level).
    for client, held in charged.items():
        if client in q.clients:
            assert q.clients[client].vt_s >= held - 1e-9


def _simulate(
    q: FairQueue, jobs: list[tuple[float, str, str, float]], horizon_s: float
) -> tuple[dict[int, float], dict[str, float]]:
    """Run ``jobs`` (arrival s, client, kind, cost s) through ``q``: returns each job's wait and each
    client's worker-seconds by ``horizon_s``."""
    events: list[tuple[float, int, str, int]] = []  # (time, order, what, ticket)
    order = 0
    cost: dict[int, float] = {}
    arrival: dict[int, float] = {}
    meta: dict[int, str] = {}
    for i, (t, client, kind, c) in enumerate(jobs):
        heapq.heappush(events, (t, order, "arrive", i))
        order += 1
        cost[i], arrival[i], meta[i] = c, t, f"{client}/{kind}"
    waits: dict[int, float] = {}
    served: dict[str, float] = {}
    while events:
        now, _, what, t = heapq.heappop(events)
        if now > horizon_s:
            break
        if what == "arrive":
            client, kind = meta[t].split("/")
            q.arrive(t, client, kind, now)
        else:
            client = q.running[t].client
            served[client] = served.get(client, 0.0) + q.finish(t, now)
        for g in q.dispatch(now):
            waits[g] = now - arrival[g]
            heapq.heappush(events, (now + cost[g], order, "finish", g))
            order += 1
    for job in q.running.values():  # what running jobs held by the horizon
        served[job.client] = served.get(job.client, 0.0) + max(0.0, horizon_s - job.start_s)
    return waits, served


@settings(max_examples=60)
@given(
    n_heavy=st.integers(2, 40),
    heavy_s=st.floats(0.2, 1.0),
    light_s=st.floats(0.001, 0.025),
    seed=st.integers(0, 1000),
)
def test_a_light_client_waits_at_most_one_heavy_job_however_many_are_queued(
    n_heavy: int, heavy_s: float, light_s: float, seed: int
) -> None:
    # Two workers; an attacker queues n_heavy jobs of heavy_s (Loops running to their deadline) at
    # once; a legit client sends a light job every 50 ms for 5 s. FIFO would make the legit wait
    # ~n_heavy * heavy_s / 2; fair queuing with the per-client cap: at most one heavy job, once.
    rng = random.Random(seed)
    jobs = [(0.0, "attacker", RUN, heavy_s) for _ in range(n_heavy)]
    jobs += [(0.01 + 0.05 * k + rng.uniform(0, 0.01), "legit", RUN, light_s) for k in range(100)]
    waits, _ = _simulate(FairQueue(FairConfig(workers=2)), jobs, horizon_s=1e9)
    legit = {i: w for i, w in waits.items() if jobs[i][1] == "legit"}
    assert len(legit) == 100
    # The legit jobs arriving while the attacker (alone until then) holds both workers wait for the
    # first heavy job to end, then for one another: the legit's own backlog, never the attacker's.
    backlog = (heavy_s / 0.04 + 1) * light_s
    assert max(legit.values()) <= heavy_s + backlog + 1e-9
    # From then on the attacker is capped at one worker while the legit client is active: once its
    # backlog drained (it uses at most 5/8 of the other worker), the legit waits for nothing.
    late = [w for i, w in legit.items() if jobs[i][0] > heavy_s + 3 * backlog]
    assert late
    assert max(late, default=0.0) <= light_s + 1e-9


def _backlogged(q: FairQueue, clients: dict[str, tuple[str, float]], horizon_s: float) -> dict[str, float]:
    """Clients that always have ``workers`` jobs waiting (kind, cost s each): worker-seconds by the horizon."""
    events: list[tuple[float, int]] = []
    cost: dict[int, float] = {}
    ticket = 0

    def submit(client: str, now: float) -> None:
        nonlocal ticket
        ticket += 1
        kind, cost[ticket] = clients[client]
        q.arrive(ticket, client, kind, now)

    for client in clients:
        for _ in range(q.config.workers):
            submit(client, 0.0)
    served = dict.fromkeys(clients, 0.0)
    now = 0.0
    while True:
        for g in q.dispatch(now):
            heapq.heappush(events, (now + cost[g], g))
            submit(q.running[g].client, now)  # keep it backlogged
        if not events or events[0][0] > horizon_s:
            break
        now, t = heapq.heappop(events)
        client = q.running[t].client
        served[client] += q.finish(t, now)
    for job in q.running.values():
        served[job.client] += max(0.0, horizon_s - job.start_s)
    return served


@settings(max_examples=60)
@given(
    workers=st.integers(1, 4),
    cost_a=st.floats(0.01, 2.0),
    cost_b=st.floats(0.01, 2.0),
    kind_a=st.sampled_from([RUN, HEAVY]),
)
def test_backlogged_clients_share_worker_seconds(workers: int, cost_a: float, cost_b: float, kind_a: str) -> None:
    # Both always have work waiting: each gets about half the worker-seconds whatever their jobs cost
    # (within a few jobs' cost: a running job is never pre-empted), and no worker idles.
    horizon = 30.0
    served = _backlogged(FairQueue(FairConfig(workers=workers)), {"a": (kind_a, cost_a), "b": (RUN, cost_b)}, horizon)
    assert served["a"] + served["b"] == pytest.approx(horizon * workers, rel=1e-6)
    bound = (workers + 1) * max(cost_a, cost_b)
    assert abs(served["a"] - served["b"]) <= bound + 1e-6


def test_heavy_work_never_takes_every_worker() -> None:
    # Builds and upload checks from many clients: one worker always stays for requests.
    q = FairQueue(FairConfig(workers=3))
    for t in range(10):
        q.arrive(t, f"c{t}", HEAVY, 0.0)
    assert len(q.dispatch(0.0)) == 2 and q.heavy_running == 2
    q.arrive(100, "legit", RUN, 0.1)
    assert q.dispatch(0.1) == [100]


def test_an_idle_client_banks_no_credit_and_returns_level() -> None:
    q = FairQueue(FairConfig(workers=1, active_window_s=0.0))
    q.arrive(1, "busy", RUN, 0.0)
    assert q.dispatch(0.0) == [1]
    q.arrive(2, "busy", RUN, 0.0)
    q.finish(1, 10.0)
    assert q.dispatch(10.0) == [2]
    # "late" was idle for 10 s: it starts at the system's level, not at 0 (10 s of credit).
    q.arrive(3, "late", RUN, 10.0)
    assert q.virtual_s("late", 10.0) == pytest.approx(q.virtual_s("busy", 10.0)) == pytest.approx(10.0)
    q.arrive(4, "busy", RUN, 10.0)
    q.finish(2, 10.5)
    # busy has held 10.5 s; late starts at the level of 10 s: late goes first.
    assert q.dispatch(10.5) == [3]


def test_clients_remembered_are_bounded() -> None:
    q = FairQueue(FairConfig(workers=1, active_window_s=0.0))
    for t in range(MAX_REMEMBERED + 50):
        q.arrive(t, f"c{t}", RUN, float(t))
        assert q.dispatch(float(t)) == [t]
        q.finish(t, t + 0.5)
    assert len(q.clients) <= MAX_REMEMBERED


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="workers >= 1"):
        FairQueue(FairConfig(workers=0))
    q = FairQueue(FairConfig(workers=1))
    with pytest.raises(ValueError, match="kind"):
        q.arrive(1, "a", "build", 0.0)
    q.arrive(1, "a", RUN, 0.0)
    with pytest.raises(ValueError, match="already"):
        q.arrive(1, "a", RUN, 0.0)
    assert math.isfinite(q.virtual_s("nobody", 0.0))


def test_a_client_is_over_its_share_only_with_jobs_waiting_while_another_is_active() -> None:
    q = FairQueue(FairConfig(workers=2, active_window_s=1.0))
    for t in range(4):  # alone, a backlogged client takes both workers at full priority
        q.arrive(t, "heavy", RUN, 0.0)
    assert q.dispatch(0.0) == [0, 1] and not q.over_share("heavy", 0.0)
    q.arrive(10, "light", RUN, 0.1)  # another client is active now: its job takes the next worker
    q.finish(0, 0.2)
    assert q.dispatch(0.2) == [10]
    assert q.over_share("heavy", 0.2) and not q.over_share("light", 0.2)
    q.finish(10, 0.25)
    q.finish(1, 0.3)
    assert q.dispatch(0.3) == [2]  # heavy still has one waiting, and light asked within the window
    assert q.over_share("heavy", 0.3)
    assert not q.over_share("heavy", 2.0)  # light went quiet: heavy is alone again
    assert q.dispatch(2.0) == [3] and not q.over_share("heavy", 2.0)  # nothing of heavy's waits
    assert not q.over_share("nobody", 2.0)
