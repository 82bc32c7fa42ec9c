"""Model work in child processes (``splitrt.cloud.models.children``): results and refusals come back, a
killed child is RESOURCE_EXHAUSTED and the next run gets a new one, a final stop refuses what comes after,
and children without work for ``idle_s`` are stopped."""

from __future__ import annotations

import os
import signal
import threading

import grpc
import pytest

from splitrt.cloud.common import RpcFailure
from splitrt.cloud.models.children import NICE, Children


def pid_and_nice(add: int) -> tuple[int, int, int]:
    return os.getpid(), os.nice(0), add + 1


def refuse() -> None:
    raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "no, said the child")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_pool_answers_refuses_survives_a_killed_child_and_stops_for_good() -> None:
    pool = Children("thinking", imports=("json",))
    try:
        pid, nice, three = pool.run(pid_and_nice, 2)
        assert pid != os.getpid() and three == 3
        assert nice == min(19, os.nice(0) + NICE)  # pytest may itself run under nice
        with pytest.raises(RpcFailure) as info:
            pool.run(refuse)
        assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION and info.value.message == "no, said the child"
        with pytest.raises(RpcFailure) as info:
            pool.run(die, what="thinking hard")
        assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.message.startswith("thinking hard: expected its process to finish, got it killed")
        again, _, _ = pool.run(pid_and_nice, 0)  # a new child
        assert again not in (pid, os.getpid())
    finally:
        pool.stop(terminate=True, final=True)
    with pytest.raises(RpcFailure) as info:
        pool.run(pid_and_nice, 0)
    assert info.value.code is grpc.StatusCode.UNAVAILABLE and "no thinking now" in info.value.message


def test_children_idle_for_idle_s_are_stopped_and_come_back_with_work() -> None:
    pool = Children("idling", idle_s=0.5)
    try:
        first, _, _ = pool.run(pid_and_nice, 0)
        for _ in range(3000):  # the idle timer stops the child (a bound against hanging, not a timing)
            if pool._pool is None:
                break
            threading.Event().wait(0.01)
        assert pool._pool is None
        second, _, _ = pool.run(pid_and_nice, 0)
        assert second != first
    finally:
        pool.stop()
