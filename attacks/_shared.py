"""Helpers shared by the adversarial suites (``bench_attack.py`` and its rows, ``bench_badinput.py``).

Imported as ``_shared`` with the attacks folder on ``sys.path``: running a script puts it there; a test
that loads a script by its file path puts it there first (``tests/cloud/test_bench_attack.py``). Importing
it puts the checkout's top on ``sys.path`` too: the suites frame raw HTTP/2 with ``tests/rawh2.py``, the
one copy the front door's tests use.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import grpc

from splitrt.rig.processes import free_port as free_port  # re-exported: the one copy

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))  # after the script's folder, before site-packages (a stray "tests")


def progress(tag: str, msg: str) -> None:
    """One progress line on stderr (stdout carries the table or the JSON)."""
    print(f"[{tag}] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def code(exc: BaseException) -> str:
    """The gRPC status code's name of a failed call, or ``client:<type>`` when no reply came."""
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        c = exc.code()
        return c.name if c is not None else "UNKNOWN"
    if isinstance(getattr(exc, "code", None), str):  # splitrt's CloudError carries the gRPC code's name
        return str(exc.code)  # type: ignore[attr-defined]
    return f"client:{type(exc).__name__}"
