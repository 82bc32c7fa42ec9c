"""One emulated device of the fleet rig (``python -m splitrt.rig.fleetworker SPEC``), JSON lines on
stdin/stdout, run by ``rig.fleet`` inside the device's namespace and cgroup.

One process per device: a network namespace belongs to a thread, and gRPC opens its sockets on its own
threads, so devices sharing a process would share a namespace (and a link). The process holds one
``AdaptiveDevice`` per strategy (sessions built once, shared) and runs one strategy's segment at a time,
closed loop: a request starts when the previous one ended (or at the pace of ``rate_hz`` if set). A
strategy's clock stands still and its prober is parked between its segments (``rig.worker``'s
``TurnClock`` / ``TurnProber``), so each strategy sees one continuous run.

Commands: ``device-calibrate`` (the whole model on this throttled device), ``cloud-calibrate`` (the
whole model on the first server), ``prepare`` (a runtime per strategy + uncounted warm-up), ``run``
(one segment: returns its request records), ``quit``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from splitrt.rig.models import cost_table_for
from splitrt.rig.worker import RigLoad, TurnClock, TurnProber

# Record fields, in order (records go back as lists: 24 devices x hundreds of requests per segment).
RECORD_FIELDS = (
    "t_s",
    "latency_ms",
    "plan",
    "server",
    "fallback",
    "error",
    "predicted_ms",
    "head_ms",
    "encode_ms",
    "rpc_ms",
    "queue_ms",
    "tail_ms",
)


def emit(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg, default=float) + "\n")
    sys.stdout.flush()


@dataclass
class _Strategy:
    dev: Any
    clock: TurnClock
    prober: TurnProber

    def close(self) -> None:
        self.prober.stop()
        self.dev.close()


class FleetDevice:
    """The device's model, sessions and strategies (built lazily on ``prepare``)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from splitrt.device.client import Device, DeviceConfig
        from splitrt.graph import model as graph
        from splitrt.profile import boards

        self.spec = spec
        self.graph = graph.load(spec["model_path"])
        self.power = boards.load_board(spec.get("board", "rpi4")).power
        self.dcfg = DeviceConfig(intra_op_threads=int(spec.get("threads", 1)), timeout_s=30.0)
        self.local = Device(self.graph, None, config=self.dcfg)
        for cut in spec.get("warm_cuts", []):
            self.local.warm(cut)
        self.inputs = self.local.random_inputs(seed=int(spec.get("seed", 0)))
        self.strategies: dict[str, _Strategy] = {}

    def device_calibrate(self, runs: int) -> float:
        feeds = self.local.check_inputs(self.inputs)
        self.local.run_head(feeds, "device")  # unmeasured: the quota settles
        return statistics.median(self.local.run_head(feeds, "device").head_ms for _ in range(runs))

    def cloud_calibrate(self, runs: int) -> float:
        from splitrt.device.client import Device

        d = Device(self.graph, self.spec["clouds"][0], config=self.dcfg)
        try:
            tails = [d.run_detailed(self.inputs, cut="cloud", timeout_s=60).tail_ms for _ in range(runs)]
        finally:
            d.close()
        return statistics.median(tails[1:] or tails)

    def prepare(self, msg: dict[str, Any]) -> None:
        from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
        from splitrt.plan.controller import ControllerConfig

        table = cost_table_for(
            Path(self.spec["profile_path"]),
            self.graph.sha256,
            float(msg["speed_factor"]),
            float(msg.get("cloud_factor", 1.0)),
        )
        codecs = self.spec.get("codecs")
        for name, policy in msg["policies"].items():
            if name in self.strategies:
                self.strategies.pop(name).close()
            rc = RuntimeConfig(
                policy=policy,
                deadline_ms=float(self.spec.get("deadline_ms", 5000.0)),
                warm_sessions=False,
                controller=ControllerConfig(codecs=tuple(codecs) if codecs else None),
            )
            clock = TurnClock()
            clouds = [] if name == "device-only" else list(self.spec["clouds"])
            dev = AdaptiveDevice(
                self.graph,
                table,
                clouds,
                config=rc,
                device_config=self.dcfg,
                power=self.power,
                clock=clock,
                start_prober=False,
            )
            dev.local = self.local  # sessions built once
            dev.load = RigLoad()  # psutil would see the whole host, not this device's cgroup
            st = _Strategy(dev=dev, clock=clock, prober=TurnProber(dev, rc.prober_interval_s))
            self.strategies[name] = st
            # Uncounted warm-up: channels, the servers' tail sessions, the estimators (a deployed
            # device has seen its link long before any measured request).
            with contextlib.suppress(Exception):
                dev.probe_once()
            st.prober.active.set()
            t_end = time.monotonic() + float(msg.get("warmup_s", 2.0))
            n = 0
            while n < 2 or time.monotonic() < t_end:
                dev.infer(self.inputs)
                n += 1
            st.prober.park()
            clock.pause()

    def run(self, name: str, t0: float, duration_s: float, rate_hz: float) -> list[list[Any]]:
        """One segment: requests start from monotonic ``t0`` until ``t0 + duration_s`` (the last one
        ends past it); records as lists of ``RECORD_FIELDS``, ``t_s`` from ``t0``."""
        st = self.strategies[name]
        while time.monotonic() < t0:
            time.sleep(0.002)
        st.clock.resume()
        st.prober.active.set()
        records: list[list[Any]] = []
        k = 0
        try:
            while True:
                now = time.monotonic()
                due = t0 + k / rate_hz if rate_hz > 0 else now
                if max(now, due) >= t0 + duration_s:
                    break
                time.sleep(max(0.0, due - now))
                start = time.monotonic()
                try:
                    out = st.dev.infer(self.inputs)
                except Exception as exc:  # infer raises only for bad inputs: count it as failed
                    records.append(
                        [start - t0, (time.monotonic() - start) * 1e3, "?", None, False, f"{type(exc).__name__}: {exc}"]
                    )
                else:
                    r = out.result
                    records.append(
                        [
                            start - t0,
                            out.latency_ms,
                            out.plan,
                            out.server,
                            out.fallback,
                            None,
                            out.decision.predicted_ms,
                            r.head_ms,
                            r.encode_ms,
                            r.rpc_ms,
                            r.queue_ms,
                            r.tail_ms,
                        ]
                    )
                k += 1
        finally:
            st.clock.pause()
            st.prober.park()
        return records

    def close(self) -> None:
        for st in self.strategies.values():
            st.close()


def serve(spec: dict[str, Any], stdin: IO[str]) -> None:
    fd = FleetDevice(spec)
    emit({"event": "loaded"})
    try:
        for line in stdin:
            msg = json.loads(line)
            cmd = msg.get("cmd")
            try:
                if cmd == "quit":
                    break
                if cmd == "device-calibrate":
                    emit({"event": "device", "head_ms": fd.device_calibrate(int(msg.get("runs", 3)))})
                elif cmd == "cloud-calibrate":
                    emit({"event": "cloud", "tail_ms": fd.cloud_calibrate(int(msg.get("runs", 5)))})
                elif cmd == "prepare":
                    fd.prepare(msg)
                    emit({"event": "prepared"})
                elif cmd == "run":
                    recs = fd.run(
                        str(msg["name"]), float(msg["t0"]), float(msg["duration_s"]), float(msg.get("rate_hz", 0.0))
                    )
                    emit({"event": "done", "records": recs, "stats": dict(fd.strategies[str(msg["name"])].dev.stats)})
                else:
                    emit({"event": "error", "message": f"unknown command {cmd!r}"})
            except Exception as exc:  # report, keep serving (the rig decides)
                emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
    finally:
        fd.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m splitrt.rig.fleetworker", description="a fleet rig device (internal)")
    p.add_argument("spec", help="JSON")
    a = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rig stops us; Ctrl-C reaches the rig
    try:
        serve(json.loads(a.spec), sys.stdin)
    except Exception as exc:
        emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
