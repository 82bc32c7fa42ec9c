"""Helpers shared by the attack benchmarks (bench_attack.py, bench_badinput.py).

Imported as ``_common`` with the bench folder on ``sys.path``: running a script puts it there; a test that
loads a script by its file path puts it there first.
"""

from __future__ import annotations

import socket
import sys
import time

import grpc


def progress(tag: str, msg: str) -> None:
    """One progress line on stderr (stdout carries the table or the JSON)."""
    print(f"[{tag}] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def code(exc: BaseException) -> str:
    """The gRPC status code's name of a failed call, or ``client:<type>`` when no reply came."""
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        c = exc.code()
        return c.name if c is not None else "UNKNOWN"
    if isinstance(getattr(exc, "code", None), str):  # splitrt's CloudError carries the gRPC code's name
        return str(exc.code)  # type: ignore[attr-defined]
    return f"client:{type(exc).__name__}"
