"""Record a decision log from real processes, for tests/plan/test_replay.py.

A real cloud server (child process) on 127.0.0.1 behind a userspace relay whose rate steps
1000 -> 15 -> 1000 Mbit/s, and this process as the device: an ``AdaptiveDevice`` running resnet50 with
the shipped profile's cost table, throttled to half a CPU by a cgroup (root) so that the best cut
moves with the rate. Writes ``tests/data/decisions_resnet50.jsonl`` and the cost table
the device planned with (``tests/data/decisions_resnet50.table.json``). The test replays the log
through a fresh controller; re-recording is only needed if the Decision schema changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.daemon import select_cost_table
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan.controller import ControllerConfig
from splitrt.rig.cgroup import CpuThrottle
from splitrt.rig.shaper import UserspaceLink

OUT = Path(__file__).resolve().parents[1] / "tests" / "data"
STEPS = ((1000.0, 20), (15.0, 20), (1000.0, 20))  # (Mbit/s, requests)


def cloud(models: str) -> None:
    """Child: the server and the relay; reads new rates (Mbit/s) on stdin, one per line."""
    with CloudServer(ServerConfig(models_dir=Path(models), host="127.0.0.1", port=0)) as server:
        server.start()
        relay = UserspaceLink(("127.0.0.1", 0), ("127.0.0.1", server.port), rate_mbps=STEPS[0][0], delay_ms=1)
        print(relay.port, flush=True)
        for line in sys.stdin:
            relay.set_rate(float(line))
            print("ok", flush=True)
        relay.close()


def main() -> int:
    path = zoo.get("resnet50")
    mg = graph.load(path)
    table, source = select_cost_table(mg)
    print(f"cost table from {source}", file=sys.stderr)
    log_path = OUT / "decisions_resnet50.jsonl"
    with tempfile.TemporaryDirectory() as models:
        (Path(models) / "resnet50.onnx").write_bytes(path.read_bytes())
        child = subprocess.Popen(
            [sys.executable, __file__, "--cloud", models], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert child.stdin is not None and child.stdout is not None
        port = int(child.stdout.readline())
        with CpuThrottle("record", 0.5) as throttle, open(log_path, "w", encoding="utf-8") as log:
            throttle.add_pid(os.getpid())
            with AdaptiveDevice(
                mg, table, [f"127.0.0.1:{port}"], config=RuntimeConfig(controller=ControllerConfig()), log=log
            ) as dev:
                inputs = dev.local.random_inputs(0)
                for rate, count in STEPS:
                    child.stdin.write(f"{rate}\n")
                    child.stdin.flush()
                    child.stdout.readline()
                    for i in range(count):
                        out = dev.infer(inputs, request=f"{rate:g}-{i}")
                        print(f"{rate:5.1f} Mbit/s {out.plan:14s} {out.latency_ms:7.1f} ms", file=sys.stderr)
        child.stdin.close()
        child.wait(timeout=30)
    (OUT / "decisions_resnet50.table.json").write_text(json.dumps(table.to_dict(), indent=1) + "\n")
    print(f"wrote {log_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cloud"]:
        cloud(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
