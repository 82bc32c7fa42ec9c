"""A ``dns:///NAME:PORT`` cloud whose name resolves to two addresses (a Kubernetes headless Service):
one channel spreads the requests over both servers with gRPC's round_robin. Root: the name lives in a
network namespace's own hosts file (``ip netns exec`` mounts ``/etc/netns/NS/hosts`` over ``/etc/hosts``),
with the two servers on 127.0.0.1 and 127.0.0.2 at the same port."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, shutil, socket, sys, tempfile
from pathlib import Path
import numpy as np
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device, DeviceConfig
from splitrt.graph import model as graph, zoo
d = Path(tempfile.mkdtemp())
shutil.copyfile(zoo.get("tiny_chain"), d / "t.onnx")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
a = CloudServer(ServerConfig(models_dir=d, host="127.0.0.1", port=port, workers=1))
b = CloudServer(ServerConfig(models_dir=d, host="127.0.0.2", port=port, workers=1))
a.start()
b.start()
err = 0.0
with Device(graph.load(d / "t.onnx"), f"dns:///fleet.test:{port}", config=DeviceConfig(timeout_s=10)) as dev:
    x = dev.random_inputs(seed=1)
    ref = dev.run_local(x)["y"]
    for _ in range(200):  # until round_robin has reached both addresses (or 200 requests)
        got = dev.run(x, cut="c2")["y"]
        err = max(err, float(np.max(np.abs(got - ref)) / (float(np.max(np.abs(ref))) or 1.0)))
        if a.served >= 3 and b.served >= 3:
            break
print(json.dumps({"a": a.served, "b": b.served, "rel_err": err}))
a.stop(0)
b.stop(0)
"""


@pytest.mark.root
@pytest.mark.parametrize("resolver", ["ares", "native"])
def test_a_name_with_two_addresses_is_round_robined(tmp_path: Path, resolver: str) -> None:
    # Not the rig's spl- prefix: its cleanup_leftovers removes namespaces it has no owner record for.
    ns = f"srt-dns{os.getpid() % 100000}"
    hosts_dir = Path("/etc/netns") / ns
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        hosts_dir.mkdir(parents=True, exist_ok=True)
        (hosts_dir / "hosts").write_text("127.0.0.1 localhost\n127.0.0.1 fleet.test\n127.0.0.2 fleet.test\n")
        child = tmp_path / "child.py"
        child.write_text(CHILD)
        env = {**os.environ, "GRPC_DNS_RESOLVER": resolver, "PYTHONPATH": str(REPO)}
        out = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, str(child)],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=REPO,
            env=env,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(hosts_dir, ignore_errors=True)
    assert got["a"] >= 3 and got["b"] >= 3, got
    assert got["rel_err"] <= 1e-5
