"""The device process of the three-tier rig bench (``python -m splitrt.rig.tierworker SPEC``), JSON lines.

It holds one runtime per strategy (``prepare``): an ``AdaptiveDevice`` over the direct path for the
two-tier strategies, one over the three tiers through the edge for the three-tier ones (``RuntimeConfig.policy``
for a static pair), and runs one strategy's turn at a time (``run``), as ``rig.worker`` does for the
two-tier bench (its clocks, parked probers and paced request loop are reused). Every request's outputs
are compared with the full model's, run here once at start.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import IO, Any

import numpy as np

from splitrt.rig import worker as rw
from splitrt.rig.models import cost_table_for


def tier_tables(
    profile_path: Path, sha: str, *, device_speed: float, edge_factor: float, cloud_factor: float
) -> tuple[Any, Any, Any]:
    """(device, edge, cloud) cost tables from one host profile: each tier's times scaled by its factor
    (the chain solver reads the device's heads, the edge's heads and the cloud's tails)."""
    dev = cost_table_for(profile_path, sha, device_speed, cloud_factor)
    edge = cost_table_for(profile_path, sha, edge_factor, edge_factor)
    cloud = cost_table_for(profile_path, sha, cloud_factor, cloud_factor)
    return dev, edge, cloud


def _matches(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> bool:
    return set(outputs) == set(reference) and all(
        np.allclose(np.asarray(outputs[k]), reference[k], rtol=1e-4, atol=1e-5) for k in reference
    )


def chain_describe(reference: dict[str, np.ndarray]) -> Any:
    """A three-tier ``Outcome`` as a request record (the same keys as ``rig.worker.describe`` where they apply)."""

    def describe(out: Any) -> dict[str, Any]:
        r, d = out.result, out.decision
        hops = r.hops
        return dict(
            latency_ms=out.latency_ms,
            plan=out.plan,
            fallback=out.fallback,
            where=r.where,
            route=out.route,
            finished_by=out.finished_by,
            head_ms=r.head_ms,
            encode_ms=r.encode_ms,
            rpc_ms=r.rpc_ms,
            decode_ms=r.decode_ms,
            tail_ms=r.tail_ms,
            queue_ms=r.queue_ms,
            bytes_up=r.bytes_up,
            bytes_down=r.bytes_down,
            edge_ms=hops.edge_ms if hops else 0.0,
            next_ms=hops.next_ms if hops else 0.0,
            forwarded=bool(hops and hops.forwarded),
            hop1_est_mbps=d.link_mbps[0],
            hop2_est_mbps=d.link_mbps[1],
            device_load=d.loads[0],
            edge_load=d.loads[1],
            cloud_load=d.loads[2],
            predicted_ms=d.predicted_ms,
            best=d.best,
            match=_matches(out.outputs, reference),
        )

    return describe


def two_describe(reference: dict[str, np.ndarray]) -> Any:
    def describe(out: Any) -> dict[str, Any]:
        return {
            **rw.describe(out),
            "route": "local" if out.result.where == "local" else "cloud",
            "finished_by": "device" if out.result.where == "local" else "cloud",
            "match": _matches(out.outputs, reference),
        }

    return describe


class _Worker:
    """The worker's state: the model, its local sessions, inputs, reference outputs, strategies."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from splitrt.device.client import Device, DeviceConfig
        from splitrt.graph import model as graph
        from splitrt.profile import boards

        self.spec = spec
        self.mg = graph.load(spec["model_path"])
        self.board = boards.load_board(spec["board"])
        self.dcfg = DeviceConfig(intra_op_threads=int(spec.get("threads", 1)), timeout_s=30.0)
        self.local = Device(self.mg, None, config=self.dcfg)
        for cut in spec.get("warm_cuts", []):
            self.local.warm(cut)
        self.inputs = self.local.random_inputs(seed=int(spec.get("seed", 0)))
        self.reference = {k: np.asarray(v) for k, v in self.local.run_local(self.inputs).items()}
        self.strategies: dict[str, rw._Strategy] = {}

    def calibrate(self, runs: int) -> dict[str, float]:
        """Whole-model times now: on the cloud (server-side tail), on the edge (``cloud>device``: the
        edge's own segment time) and on this device (the rig throttles it meanwhile)."""
        from splitrt.device.client import Device

        out: dict[str, float] = {}
        for name, address, nxt in (("cloud", self.spec["cloud"], None), ("edge", self.spec["edge"], "device")):
            d = Device(self.mg, address, config=self.dcfg)
            try:
                times = []
                for _ in range(runs):
                    head = d.run_head(self.inputs, "cloud")
                    times.append(d.send(head, timeout_s=60, next_cut=nxt).tail_ms)
            finally:
                d.close()
            out[f"{name}_ms"] = statistics.median(times[1:] or times)
        return out

    def device_ms(self, runs: int) -> float:
        feeds = self.local.check_inputs(self.inputs)
        self.local.run_head(feeds, "device")  # unmeasured: the quota settles
        return statistics.median(self.local.run_head(feeds, "device").head_ms for _ in range(runs))

    def warm_edge(self, pairs: list[str]) -> int:
        """One request per chain plan (``A>B@codec``) so the edge and the cloud build their segments
        before the timed part; returns how many answered."""
        from splitrt.device.client import Device
        from splitrt.plan.path import parse_path

        d = Device(self.mg, self.spec["edge"], config=self.dcfg)
        ok = 0
        try:
            for plan in pairs:
                (a, b), (codec, _) = parse_path(plan, hops=2)
                with contextlib.suppress(Exception):
                    d.send(self.local.run_head(self.inputs, a), codec_spec=codec, next_cut=b, timeout_s=60)
                    ok += 1
        finally:
            d.close()
        return ok

    def runtime(self, msg: dict[str, Any], clock: rw.TurnClock) -> tuple[Any, Any, float]:
        """(runtime, describe, prober interval) of one strategy."""
        from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
        from splitrt.plan.controller import ControllerConfig
        from splitrt.rig.tierplans import chain_config

        spec = self.spec
        codecs = tuple(spec.get("codecs") or ("fp32",))
        objective = str(spec.get("objective", "latency"))
        d_tbl, e_tbl, c_tbl = tier_tables(
            Path(spec["profile_path"]),
            self.mg.sha256,
            device_speed=float(msg["speed_factor"]),
            edge_factor=float(msg["edge_factor"]),
            cloud_factor=float(msg["cloud_factor"]),
        )
        if int(msg["tiers"]) == 2:
            rc = RuntimeConfig(
                policy=msg["policy"],
                deadline_ms=float(spec["deadline_ms"]),
                warm_sessions=False,
                controller=ControllerConfig(objective=objective, codecs=codecs),
            )
            with_cloud = msg["policy"] != "fixed:device"
            dev: Any = AdaptiveDevice(
                self.mg,
                d_tbl,
                [spec["cloud"]] if with_cloud else [],
                config=rc,
                device_config=self.dcfg,
                power=self.board.power,
                clock=clock,
                start_prober=False,
            )
            return dev, two_describe(self.reference), rc.prober_interval_s
        cc = RuntimeConfig(
            deadline_ms=float(spec["deadline_ms"]),
            policy=msg["policy"],
            warm_sessions=False,
            controller=chain_config(objective, codecs),
        )
        dev = AdaptiveDevice(
            self.mg,
            (d_tbl, e_tbl, c_tbl),
            path=[[spec["edge"]], [spec["cloud"]]],
            config=cc,
            device_config=self.dcfg,
            power=self.board.power,
            clock=clock,
            start_prober=False,
        )
        return dev, chain_describe(self.reference), cc.prober_interval_s

    def prepare(self, msg: dict[str, Any]) -> None:
        """Build one strategy's runtime and warm it up (uncounted requests at the bench's rate)."""
        name = str(msg["name"])
        if name in self.strategies:
            self.strategies.pop(name).close()
        clock = rw.TurnClock()
        dev, describe, interval_s = self.runtime(msg, clock)
        dev.local = self.local  # sessions built once, outside the cgroup
        dev.load = rw.RigLoad()  # psutil would see the whole (busy) host, not the emulated board
        st = rw._Strategy(
            dev=dev,
            clock=clock,
            prober=rw.TurnProber(dev, interval_s),
            runqueue=rw.RunQueueProbe(dev.load, None, clock=clock),
            jitter=random.Random(int(self.spec.get("seed", 0))),
            describe=describe,
        )
        self.strategies[name] = st
        with contextlib.suppress(Exception):
            dev.probe_once()  # a daemon starts with a probe: RTTs before transfers are timed
        st.prober.active.set()
        rate_hz = float(msg.get("rate_hz", 4.0))
        t_warm, n = time.monotonic(), 0
        while n < 2 or time.monotonic() - t_warm < float(msg.get("warmup_s", rw.WARMUP_S)):
            time.sleep(max(0.0, t_warm + n / rate_hz - time.monotonic()))
            dev.infer(self.inputs)
            n += 1
        time.sleep(0.6)  # a few prober rounds
        st.prober.park()
        clock.pause()

    def close(self) -> None:
        for st in self.strategies.values():
            st.close()


def serve(spec: dict[str, Any], stdin: IO[str]) -> None:
    w = _Worker(spec)
    rw._emit({"event": "loaded"})
    try:
        for line in stdin:
            msg = json.loads(line)
            cmd = msg.get("cmd")
            try:
                if cmd == "quit":
                    break
                if cmd == "calibrate":
                    rw._emit({"event": "calibrated", **w.calibrate(int(msg.get("runs", 5)))})
                elif cmd == "device-calibrate":
                    rw._emit({"event": "device", "head_ms": w.device_ms(int(msg.get("runs", 3)))})
                elif cmd == "warm-edge":
                    rw._emit({"event": "warmed", "answered": w.warm_edge(list(msg["plans"]))})
                elif cmd == "prepare":
                    w.prepare(msg)
                    rw._emit({"event": "prepared"})
                elif cmd == "roles":
                    rw._emit({"event": "roles", **rw._thread_roles(w.strategies.values())})
                elif cmd == "run":
                    st = w.strategies[str(msg["name"])]
                    end_s = rw._run_turn(
                        st,
                        w.inputs,
                        t0=float(msg["t0"]),
                        from_s=float(msg["from_s"]),
                        until_s=float(msg["until_s"]),
                        rate_hz=float(msg["rate_hz"]),
                        log_path=Path(msg["log_path"]),
                        tasks_file=None,
                    )
                    rw._emit({"event": "done", "stats": dict(st.dev.stats), "end_s": end_s})
                else:
                    rw._emit({"event": "error", "message": f"unknown command {cmd!r}"})
            except Exception as exc:  # report, keep serving (the rig decides)
                rw._emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
    finally:
        w.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m splitrt.rig.tierworker SPEC_JSON (internal: started by splitrt.rig.tiers)",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rig stops us; Ctrl-C reaches the rig
    try:
        serve(json.loads(args[0]), sys.stdin)
    except Exception as exc:
        rw._emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
