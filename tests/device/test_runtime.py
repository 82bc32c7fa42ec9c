"""runtime: never lose a request. A real cloud on 127.0.0.1 is killed mid-stream, brought back, and
a second cloud takes over when the first stops (real servers: the socket behaviour is the test). The
tests that need only a working cloud run on its servicer through the in-process transport
(``AdaptiveDevice(connect=...)``)."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import DeviceConfig
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig, slow_start_after_idle
from splitrt.device.runtime.clouds import Clouds
from splitrt.errors import CloudError, ConfigError, InputError
from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.plan.controller import ControllerConfig, Decision
from splitrt.plan.costmodel import CostTable
from splitrt.plan.netmon import LoadConfig, LoadEstimator
from splitrt.plan.replay import replay
from splitrt.profile.priors import flops_table
from tests.conftest import rel_err
from tests.fakecloud import FakeCloud, connect_any
from tests.loopback import free_port, serve

MODEL = "squeezenet"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("rt-models")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    return d


@pytest.fixture(scope="module")
def mg() -> graph.ModelGraph:
    return graph.load(zoo.get(MODEL))


def cloud_favoured(mg: graph.ModelGraph) -> RuntimeConfig:
    return RuntimeConfig(deadline_ms=3000, backoff_initial_s=0.1, backoff_max_s=0.5, prober_interval_s=0.05)


@pytest.fixture()
def server(models_dir: Path) -> FakeCloud:
    return FakeCloud(models_dir)


def test_adaptive_requests_match_the_local_model(server: FakeCloud, mg: graph.ModelGraph) -> None:
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    with AdaptiveDevice(
        mg,
        table,
        [server.address],
        connect=server.connect,
        config=cloud_favoured(mg),
        device_config=DeviceConfig(intra_op_threads=1),
    ) as dev:
        x = dev.local.random_inputs(seed=1)
        ref = dev.local.run_local(x)
        outs = [dev.infer(x) for _ in range(5)]
        clouds = dev.clouds()
    # Early requests may legitimately pick `device` while the estimates settle; most must split.
    assert sum(o.server == server.address for o in outs) >= 3, ([(o.plan, o.server) for o in outs], clouds)
    assert not any(o.fallback for o in outs)
    for o in outs:
        assert rel_err(ref["softmaxout_1"], o.outputs["softmaxout_1"]) <= 1e-5


def test_bad_input_is_refused_and_the_runtime_keeps_serving(server: FakeCloud, mg: graph.ModelGraph) -> None:
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    with AdaptiveDevice(mg, table, [server.address], connect=server.connect, config=cloud_favoured(mg)) as dev:
        x = dev.local.random_inputs()
        with pytest.raises(InputError, match=r"expected shape \[1, 3, 224, 224\], got \[1, 3, 10, 10\]"):
            dev.infer({"data_0": np.zeros((1, 3, 10, 10), np.float32)})
        assert not dev.infer(x).fallback


def test_cost_table_of_another_model_is_refused(mg: graph.ModelGraph) -> None:
    other = flops_table(graph.load(zoo.get("tiny_chain")), device_gflops=5, cloud_gflops=100)
    with pytest.raises(ConfigError, match="expected a profile of this model"):
        AdaptiveDevice(mg, other, [], start_prober=False)


@pytest.mark.slow
def test_server_killed_mid_stream_loses_nothing_and_splitting_resumes(
    models_dir: Path, mg: graph.ModelGraph, tmp_path: Path
) -> None:
    port = free_port()
    proc = serve(models_dir, port)
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    log_path = tmp_path / "decisions.jsonl"
    inputs = [zoo.random_inputs(zoo.get(MODEL), seed=s) for s in range(4)]
    try:
        with (
            log_path.open("w") as log,
            AdaptiveDevice(
                mg,
                table,
                [f"127.0.0.1:{port}"],
                config=cloud_favoured(mg),
                log=log,
                device_config=DeviceConfig(intra_op_threads=1),
            ) as dev,
        ):
            refs = [dev.local.run_local(x)["softmaxout_1"] for x in inputs]
            outcomes = []
            restarted_at = None
            for i in range(200):
                if i == 40:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
                if i == 80:
                    proc = serve(models_dir, port)
                    restarted_at = time.monotonic()
                o = dev.infer(inputs[i % 4], request=str(i))
                outcomes.append(o)
                assert rel_err(refs[i % 4], o.outputs["softmaxout_1"]) <= 1e-5, i
            assert any(o.fallback or o.plan == "device" for o in outcomes[40:80])
            assert restarted_at is not None

            def resumed() -> bool:
                return any(o.server is not None and not o.fallback for o in outcomes[80:])

            # Splitting resumes on the restarted server: waited for (bounded), not timed (how soon is
            # the prober's business, measured in bench/, not asserted here).
            end = time.monotonic() + 60.0
            while not resumed() and time.monotonic() < end:
                i = len(outcomes)
                o = dev.infer(inputs[i % 4], request=str(i))
                outcomes.append(o)
                assert rel_err(refs[i % 4], o.outputs["softmaxout_1"]) <= 1e-5, i
                time.sleep(0.05)  # pacing only: the prober's backoff runs on the clock
            assert resumed(), "splitting never resumed on the restarted server"
            assert dev.stats["completed"] == len(outcomes) and dev.stats["failed"] == 0
    finally:
        proc.kill()
        proc.wait(10)
    # the decision log replays to the same decisions
    lines = log_path.read_text().splitlines()
    assert len(lines) == len(outcomes) and Decision.from_json(lines[0]).request == "0"
    for logged, again in replay(lines, table, ControllerConfig()):
        assert again.plan == logged.plan
    # a request the cloud answered logs the bytes it sent beside those its upload was priced with
    observed = [Decision.from_json(x).extra.get("observed") for x in lines]
    sent = [o for o, out in zip(observed, outcomes, strict=True) if o and out.server and not out.fallback]
    assert sent and all(o["sent_bytes"] > 0 and o["priced_bytes"] > 0 for o in sent)


def test_failover_to_the_second_cloud_with_no_failed_request(models_dir: Path, mg: graph.ModelGraph) -> None:
    a = CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))
    b = CloudServer(ServerConfig(models_dir=models_dir, workers=1, intra_op_threads=1))
    a.start()
    b.start()
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    try:
        with AdaptiveDevice(mg, table, [a.address, b.address], config=cloud_favoured(mg)) as dev:
            x = dev.local.random_inputs()
            servers = [dev.infer(x).server for _ in range(5)]
            first = servers[-1]
            (a if first == a.address else b).stop(grace_s=0.2)
            after = [dev.infer(x) for _ in range(10)]
        other = b.address if first == a.address else a.address
        assert after[-1].server == other
        assert sum(o.fallback for o in after) <= 1  # at most the request that met the dead server
        assert all(o.outputs for o in after)
    finally:
        a.stop(grace_s=0.2)
        b.stop(grace_s=0.2)


def test_fixed_and_periodic_policies(server: FakeCloud, mg: graph.ModelGraph) -> None:
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    cut = mg.cuts()[10].id
    with AdaptiveDevice(
        mg, table, [server.address], connect=server.connect, config=RuntimeConfig(policy=f"fixed:{cut}@fp16")
    ) as dev:
        x = dev.local.random_inputs()
        assert {dev.infer(x).plan for _ in range(3)} == {f"{cut}@fp16"}
    clock = [0.0]
    with AdaptiveDevice(
        mg,
        table,
        [server.address],
        connect=server.connect,
        config=RuntimeConfig(policy="periodic:5"),
        clock=lambda: clock[0],
        start_prober=False,
    ) as dev:
        first = dev.infer(x)
        dev.link.add_rate(0.1, 0.05)  # the link collapses...
        dev.link.add_rate(0.2, 0.05)
        clock[0] = 1.0
        assert dev.infer(x).plan == first.plan  # ...but periodic re-plans only every 5 s
        clock[0] = 5.5
        assert dev.infer(x).plan != first.plan
    with pytest.raises(ConfigError, match="policy"):
        RuntimeConfig(policy="sometimes")


def test_periodic_log_replays_and_bad_fixed_plan_fails_at_start(server: FakeCloud, mg: graph.ModelGraph) -> None:
    import io

    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    log = io.StringIO()
    clock = [0.0]
    with AdaptiveDevice(
        mg,
        table,
        [server.address],
        connect=server.connect,
        config=RuntimeConfig(policy="periodic:2"),
        log=log,
        clock=lambda: clock[0],
        start_prober=False,
    ) as dev:
        x = dev.local.random_inputs()
        for i in range(12):
            clock[0] = i * 0.5
            if i == 5:
                dev.link.add_rate(clock[0], 0.05)
                dev.link.add_rate(clock[0], 0.05)
            dev.infer(x)
    pairs = replay(log.getvalue().splitlines(), table)
    assert len(pairs) == 12 and all(a.plan == b.plan for a, b in pairs)
    assert len({a.plan for a, _ in pairs}) >= 2  # it did re-plan
    for bad in ("fixed:c9999", "fixed:c5@bogus"):
        with pytest.raises(ConfigError, match="policy"):
            AdaptiveDevice(mg, table, [], config=RuntimeConfig(policy=bad), start_prober=False)


def test_a_local_encoding_error_falls_back_and_keeps_the_cloud(server: FakeCloud, mg: graph.ModelGraph) -> None:
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    cut = mg.cuts()[5].id
    with AdaptiveDevice(
        mg,
        table,
        [server.address],
        connect=server.connect,
        config=RuntimeConfig(policy=f"fixed:{cut}@int8"),
        start_prober=False,
    ) as dev:
        x = dev.local.random_inputs()
        x["data_0"][0, 0, 0, 0] = np.inf  # int8 cannot encode inf: the request must still complete
        out = dev.infer(x)
        assert out.fallback and dev.stats["local_errors"] == 1 and "int8" in dev.last_local_error
        assert dev.clouds()[0]["up"]


def test_clouds_are_tried_in_the_given_order(models_dir: Path, mg: graph.ModelGraph) -> None:
    a, b = FakeCloud(models_dir, "in-process-a"), FakeCloud(models_dir, "in-process-b")
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    cut = mg.cuts()[5].id
    for order in ([a.address, b.address], [b.address, a.address]):
        with AdaptiveDevice(
            mg,
            table,
            order,
            config=RuntimeConfig(policy=f"fixed:{cut}@fp32"),
            start_prober=False,
            connect=connect_any(a, b),
        ) as dev:
            assert dev.infer(dev.local.random_inputs()).server == order[0]
    assert a.connects == b.connects == 2  # one transport per cloud per runtime


@pytest.mark.parametrize("pairs", [True, False])
def test_bandwidth_probes_go_in_pairs_unless_told_not_to(server: FakeCloud, mg: graph.ModelGraph, pairs: bool) -> None:
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    cfg = RuntimeConfig(bandwidth_probe_pairs=pairs)
    with AdaptiveDevice(mg, table, [server.address], connect=server.connect, config=cfg, start_prober=False) as dev:
        cloud = next(iter(dev._clouds.values()))
        sizes: list[int] = []
        real_probe = cloud.link.probe

        def counted(up: int, down: int, **kw: float) -> object:
            sizes.append(up)
            return real_probe(up, down, **kw)

        cloud.link.probe = counted  # type: ignore[method-assign]
        dev.probe_once()  # a fresh estimator: the link needs an RTT and a bandwidth sample
    assert sizes[0] == 64  # the RTT probe first
    bandwidth = sizes[1:]
    assert len(bandwidth) == (2 if pairs else 1), sizes
    assert all(b > 64 for b in bandwidth)


def test_probe_pairs_follow_the_kernels_slow_start_after_idle(tmp_path: Path) -> None:
    knob = tmp_path / "tcp_slow_start_after_idle"
    knob.write_text("0\n")
    assert slow_start_after_idle(str(knob)) is False  # the rig's namespaces: one probe is enough
    knob.write_text("1\n")
    assert slow_start_after_idle(str(knob)) is True  # Linux's default: the first probe meets a cold window
    assert slow_start_after_idle(str(tmp_path / "missing")) is True  # unknown: assume the default


@pytest.mark.serial
def test_the_runtime_learns_the_devices_speed_from_its_heads(mg: graph.ModelGraph) -> None:
    """A profile 1.5x too optimistic about the device: after a few requests on the device plan the
    runtime's device factor says how much slower the heads really are."""
    probe = flops_table(mg, device_gflops=5, cloud_gflops=100)
    # A fresh session's first runs are 2-3x slow here (arena growth, page faults): warm up before timing.
    with AdaptiveDevice(mg, probe, [], config=RuntimeConfig(policy="fixed:device"), start_prober=False) as dev:
        inputs = dev.local.random_inputs()
        for _ in range(10):
            dev.infer(inputs)
        real = float(np.median([dev.infer(inputs).result.total_ms for _ in range(15)]))
    # Every head 1.6x faster than the real one (the FLOPs prior is not linear in its GFLOP/s: scale the
    # table itself).
    k = real / 1.6 / float(probe.head_ms[probe.index("device")])
    table = CostTable(
        ids=probe.ids,
        head_ms=probe.head_ms * k,
        tail_ms=probe.tail_ms,
        bytes=probe.bytes,
        float_bytes=probe.float_bytes,
        reply_bytes=probe.reply_bytes,
        codecs=probe.codec_map(),
    )
    with AdaptiveDevice(mg, table, [], config=RuntimeConfig(policy="fixed:device"), start_prober=False) as dev:
        for _ in range(10):
            dev.infer(inputs)
        dev.load = LoadEstimator(LoadConfig(min_profiled_ms=0.0))  # this test model is small and fast
        assert dev.load.estimate(dev.clock()).device_factor == 1.0
        measured = [dev.infer(inputs).result.total_ms for _ in range(20)]
        factor = dev.load.estimate(dev.clock()).device_factor
    # This host's speed drifts by 10-30 % between runs: compare with what the last requests took (the
    # estimate is an EWMA, alpha 0.2).
    slower = float(np.median(measured[-8:])) / float(table.head_ms[table.index("device")])
    assert slower > 1.05, f"the heads ran {slower:.2f}x the table: the setup did not make it optimistic"
    assert factor == pytest.approx(min(slower, LoadConfig().max_speed), rel=0.15)  # (speed is clamped)


def test_a_failed_cloud_gets_a_fresh_transport_from_connect(server: FakeCloud, mg: graph.ModelGraph) -> None:
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    cut = mg.cuts()[5].id
    now = [100.0]
    with AdaptiveDevice(
        mg,
        table,
        [server.address],
        connect=server.connect,
        start_prober=False,
        clock=lambda: now[0],
        config=RuntimeConfig(policy=f"fixed:{cut}@fp32"),
    ) as dev:
        assert server.connects == 1
        x = dev.local.random_inputs()
        assert dev.infer(x).server == server.address
        cloud = dev._clouds[server.address]
        dev._clouds.mark_failed(cloud, dev.clock(), CloudError("refused", code="UNAVAILABLE"))
        assert server.connects == 2 and not dev.clouds()[0]["up"]  # a new transport for the next try
        now[0] += 1.0  # past the backoff
        dev.probe_once()  # the probe on the fresh transport brings it back
        assert dev.clouds()[0]["up"] and dev.infer(x).server == server.address
        dev.set_clouds([server.address, "in-process-b"])  # a new address: connect(address) once more
    assert server.connects == 3


def test_a_plan_with_an_entropy_coded_codec_is_served_and_priced_per_cut(
    server: FakeCloud, mg: graph.ModelGraph
) -> None:
    """The shipped profile prices int8c+zstd per cut; a slow board on a slow link chooses it, the device
    encodes it, the (real, in-process) server decodes it, and the outputs stay those of the model."""
    from splitrt.plan import solver
    from splitrt.plan.costmodel import Conditions, Link
    from splitrt.profile import profiler

    prof = profiler.load_profile(f"x86_64-2core__{MODEL}.json", sha256=mg.sha256)
    # the zoo's random weights: no accuracy to guard (profile.accuracy), the table prices codecs by bytes
    table = profiler.cost_table(prof, prof, device_speed_factor=30.0, min_agreement=0.0)
    best = solver.solve(
        table, Conditions(link=Link(bandwidth_mbps=10.0, rtt_ms=20.0)), codecs=["fp32", "int8c", "int8c+zstd"]
    )
    assert best.codec == "int8c+zstd" and best.cut not in ("cloud", "device")
    with AdaptiveDevice(
        mg, table, [server.address], connect=server.connect, config=RuntimeConfig(policy=f"fixed:{best.key}")
    ) as dev:
        x = dev.local.random_inputs(seed=2)
        ref = dev.local.run_local(x)
        out = dev.infer(x)
        assert out.plan == best.key and not out.fallback
        for name in ref:
            assert rel_err(ref[name], out.outputs[name]) < 0.05


def test_every_decision_names_the_cost_table_and_its_accuracy_guard(server: FakeCloud, mg: graph.ModelGraph) -> None:
    """The table's source (``profile.tables.build``: profiles, board, accuracy guard) is in each decision."""
    import io

    from splitrt.profile import tables

    costs = tables.build(mg)
    assert "accuracy guard: no samples, lossless codecs only" in costs.source  # the shipped zoo profile
    log = io.StringIO()
    config = RuntimeConfig(table_source=costs.source)
    with AdaptiveDevice(mg, costs.table, [server.address], connect=server.connect, config=config, log=log) as dev:
        dev.infer(dev.local.random_inputs(seed=1))
    (line,) = log.getvalue().splitlines()
    assert Decision.from_json(line).extra["costs"] == costs.source


def test_a_requests_wait_behind_the_devices_own_bandwidth_probe_is_measured() -> None:
    clouds = Clouds(None, DeviceConfig(), backoff_initial_s=1.0, backoff_max_s=2.0, lock=threading.RLock())
    before = time.perf_counter()
    assert clouds.probe_wait_ms(before - 1.0, before) == 0.0  # no probe yet
    with clouds.probing(rtt_s=0.0):
        inside = time.perf_counter()
        # a request sent while the probe is on the wire: its wait so far, the probe still going
        assert clouds.probe_wait_ms(inside, inside + 1.0) == pytest.approx(1e3, rel=1e-6)
    after = time.perf_counter()
    # the span is kept: a request that began before and ended after waited at most the probe's time
    assert 0.0 < clouds.probe_wait_ms(before, after + 1.0) <= (after - before) * 1e3
    assert clouds.probe_wait_ms(after, after + 1.0) == 0.0  # sent after it: no wait
    # the probe's reply (its last RTT) keeps no request waiting
    with clouds.probing(rtt_s=10.0):
        pass
    assert clouds.probe_wait_ms(after, time.perf_counter() + 1.0) == 0.0


def test_a_reply_wakes_the_prober_into_the_gap_before_the_next_request(server: FakeCloud, mg: graph.ModelGraph) -> None:
    """Requests 4 a second: the prober's timer is 30 s away, so only the replies can have woken it."""
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    cfg = RuntimeConfig(prober_interval_s=30.0, bandwidth_probe_pairs=False)
    with AdaptiveDevice(mg, table, [server.address], connect=server.connect, config=cfg) as dev:
        cloud = next(iter(dev._clouds.values()))
        sent: list[tuple[float, int]] = []
        real_probe = cloud.link.probe

        def counted(up: int, down: int, **kw: float) -> object:
            sent.append((time.monotonic(), up))
            return real_probe(up, down, **kw)

        cloud.link.probe = counted  # type: ignore[method-assign]
        x = dev.local.random_inputs(seed=1)
        replies = []
        for _ in range(10):
            t0 = time.monotonic()
            if dev.infer(x).server == server.address:
                replies.append(time.monotonic())
            time.sleep(max(0.0, 0.25 - (time.monotonic() - t0)))
        assert len(replies) >= 6, replies
        assert dev.pace.gap_s(dev.clock()) is not None  # a steady flow
    assert sent, "no probe: a reply did not wake the prober"
    # each went out about when a reply came (``infer`` returns just after it wakes the prober)
    assert all(any(-0.05 <= t - r <= 0.1 for r in replies) for t, _ in sent), (sent, replies)
