"""runtime: per-shape plans. A model with free dims (yolo_tiny: height, width) profiled at one shape serves
requests of others; each new shape gets its own scaled table and controller, and one cloud tail serves
every shape."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest

from splitrt.device.client import DeviceConfig
from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
from splitrt.errors import InputError
from splitrt.graph import model as graph
from splitrt.graph import rebind, shapes, zoo
from splitrt.plan.controller import ControllerConfig, Decision
from splitrt.plan.reshape import replay_by_shape, signature
from splitrt.profile.priors import flops_table
from tests.conftest import rel_err
from tests.fakecloud import FakeCloud

MODEL = "yolo_tiny"
A = (1, 3, 320, 320)  # the profiled shape
B = (1, 3, 256, 416)  # an OCR-like crop: fewer rows, more columns


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("rt-shape-models")
    shutil.copyfile(zoo.get(MODEL), d / f"{MODEL}.onnx")
    return d


@pytest.fixture(scope="module")
def mg() -> graph.ModelGraph:
    return graph.load(zoo.get(MODEL), shapes.binding_from(dims=["height=320", "width=320"]))


@pytest.fixture()
def server(models_dir: Path) -> FakeCloud:
    return FakeCloud(models_dir)  # a working cloud is all these tests need: in-process, no socket


def image(shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    return {"images": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def runtime(mg: graph.ModelGraph, server: FakeCloud | None, **config: object) -> AdaptiveDevice:
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    cfg = RuntimeConfig(deadline_ms=5000, backoff_initial_s=0.1, backoff_max_s=0.5, **config)  # type: ignore[arg-type]
    return AdaptiveDevice(
        mg,
        table,
        [server.address] if server else [],
        config=cfg,
        device_config=DeviceConfig(intra_op_threads=1),
        start_prober=False,
        connect=server.connect if server else None,
    )


def test_each_shape_gets_its_own_table_and_controller(server: FakeCloud, mg: graph.ModelGraph) -> None:
    log = io.StringIO()
    # Every plan remote: the in-process cloud shares this CPU, so as the load factors learn the real speeds
    # the device (no transfer) rightly wins, soonest on a busy host; the shapes' tables are the point here.
    remote = ControllerConfig(cuts=tuple(c.id for c in mg.cuts() if c.id != "device"))
    with runtime(mg, server, controller=remote) as dev:
        dev.log = log
        for _ in range(2):  # a fast link (as the prober would find on 127.0.0.1)
            dev.link.add_rate(dev.clock(), 500.0)
            dev.link.add_rtt(dev.clock(), 1.0)
        refs = {s: dev.local.run_local(image(s)) for s in (A, B)}
        outs = [dev.infer(image(s)) for s in (A, A, B, A, B, B, A)]
        plans = dev.shape_plans()
        tables = {sig: dev.table_for(sig) for sig in plans}
        built = dev.stats["shape_tables"]
        profiled_table = dev.table
    for o, s in zip(outs, (A, A, B, A, B, B, A), strict=True):
        assert o.outputs["output0"].shape == refs[s]["output0"].shape
        assert rel_err(refs[s]["output0"], o.outputs["output0"]) < 1e-5
        assert o.decision.extra["shape"] == {"images": list(s)}
    assert all(o.server == server.address and not o.fallback for o in outs), [(o.plan, o.server) for o in outs]
    # A, A, B, A, B, B, A: one table built (B's); A keeps the table it was given.
    sig_a, sig_b = signature({"images": A}), signature({"images": B})
    assert built == 1 and list(plans) == [sig_a, sig_b]
    assert plans[sig_a].table is profiled_table and plans[sig_a].source == "profiled"
    assert plans[sig_b].source == "scaled"
    assert plans[sig_b].controller is not plans[sig_a].controller
    # B's first decision came from a fresh controller (its own hysteresis), not A's plan in use.
    assert outs[2].decision.previous is None and outs[1].decision.previous is not None
    # B's bytes are the graph's own at B, times scaled by the FLOPs (B has 416/400 of A's pixels).
    at_b = graph.load(zoo.get(MODEL), shapes.binding_from(shapes=["images=1x3x256x416"]))
    expect = [c.bytes if c.id != "device" else 0 for c in at_b.cuts()]
    t_b = plans[sig_b].table
    np.testing.assert_array_equal(t_b.bytes, expect)
    assert t_b.bytes[0] == profiled_table.bytes[0] * (256 * 416) // (320 * 320)  # the cloud cut: the image
    assert t_b.reply_bytes[0] == sum(o.bytes for o in at_b.outputs) != profiled_table.reply_bytes[0]
    np.testing.assert_array_equal(t_b.reply_bytes, [c.reply_bytes for c in at_b.cuts()])
    full = t_b.index("device")
    # Scaled between "every node a fixed cost" (x1) and "all of it arithmetic" (the FLOPs ratio).
    r, fr = t_b.head_ms[full] / profiled_table.head_ms[full], at_b.flops / mg.flops
    assert min(1.0, fr) - 1e-9 <= r <= max(1.0, fr) + 1e-9 and r != 1.0
    # The log replays: each shape's decisions through its own fresh controller.
    pairs = replay_by_shape(log.getvalue().splitlines(), lambda sig: tables[sig or sig_a], remote)
    assert len(pairs) == 7 and all(a.plan == b.plan for a, b in pairs)
    assert {Decision.from_json(line).extra["table"] for line in log.getvalue().splitlines()} == {"profiled", "scaled"}


def test_one_cloud_tail_serves_two_shapes(server: FakeCloud, mg: graph.ModelGraph) -> None:
    cut = mg.cuts()[len(mg.cuts()) // 2].id
    with runtime(mg, server, policy=f"fixed:{cut}@fp32") as dev:
        for s in (A, B):
            x = image(s, seed=3)
            out = dev.infer(x)
            assert out.server == server.address and not out.fallback, dev.last_local_error
            assert rel_err(dev.local.run_local(x)["output0"], out.outputs["output0"]) < 1e-5
            assert out.result.bytes_up > 0
    tails = [(c, hits) for sha, c, hits in server.server.tails.snapshot() if sha == mg.sha256]
    assert tails == [(cut, 2)]  # built once, at A; B used the same session


def test_the_bound_graph_still_refuses_what_the_model_refuses(mg: graph.ModelGraph) -> None:
    with runtime(mg, None, policy="fixed:device") as dev:
        assert dev.local.random_inputs()["images"].shape == A  # random inputs: still at the binding
        assert dev.infer(image((1, 3, 320, 448))).outputs["output0"].shape[0] == 1  # free height/width: fine
        with pytest.raises(InputError, match="expected shape"):
            dev.infer(image((1, 4, 320, 320)))  # channels are fixed at 3


def test_alternating_shapes_reuse_their_tables_and_the_lru_is_bounded(mg: graph.ModelGraph) -> None:
    c, d = (1, 3, 256, 256), (1, 3, 320, 416)
    with runtime(mg, None, policy="fixed:device") as dev:
        for s in (A, c, A, c, A):
            dev.infer(image(s))
        assert dev.stats["shape_tables"] == 1
    with runtime(mg, None, policy="fixed:device", max_shapes=1) as dev:
        for s in (c, d, c, A):
            dev.infer(image(s))
        # c, then d evicts c, then c again: 3 builds; A (the profiled shape) is never evicted or built.
        assert dev.stats["shape_tables"] == 3
        assert list(dev.shape_plans()) == [signature({"images": A}), signature({"images": c})]


def test_an_unbound_graph_plans_the_first_request_shape_with_the_table(mg: graph.ModelGraph) -> None:
    table = flops_table(mg, device_gflops=5, cloud_gflops=100)
    unbound = graph.load(zoo.get(MODEL))
    cfg = RuntimeConfig(policy="fixed:device")
    with AdaptiveDevice(unbound, table, [], config=cfg, start_prober=False) as dev:
        dev.infer(image(B))
        dev.infer(image(A))
        plans = dev.shape_plans()
        assert list(plans) == [signature({"images": B}), signature({"images": A})]
        assert plans[signature({"images": B})].table is table and dev.stats["shape_tables"] == 1
    # Told where the table was profiled, the first request of another shape gets a scaled table.
    with AdaptiveDevice(unbound, table, [], config=cfg, start_prober=False, table_shapes={"images": A}) as dev:
        dev.infer(image(B))
        t_b = dev.table_for(signature({"images": B}))
        assert t_b is not table and dev.stats["shape_tables"] == 1
        np.testing.assert_array_equal(t_b.bytes, rebind.cut_costs_at(mg, {"images": B}).bytes)


def test_two_input_model_and_concurrent_first_requests_build_once() -> None:
    """bert_tiny (ids + mask, free seq): a signature covers both inputs; four threads meeting a new
    shape at once build its table once."""
    from concurrent.futures import ThreadPoolExecutor

    path = zoo.get("bert_tiny")
    bound = graph.load(path, shapes.binding_from(dims=["seq=16"]))
    table = flops_table(bound, device_gflops=5, cloud_gflops=100)

    def tokens(seq: int) -> dict[str, np.ndarray]:
        return {"input_ids": np.arange(seq, dtype=np.int64)[None] % 100, "attention_mask": np.ones((1, seq), np.int64)}

    with AdaptiveDevice(bound, table, [], config=RuntimeConfig(policy="fixed:device"), start_prober=False) as dev:
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda _: dev.infer(tokens(40)), range(4)))
        dev.infer(tokens(16))
        assert dev.stats["shape_tables"] == 1
        sig = signature({"input_ids": (1, 40), "attention_mask": (1, 40)})
        assert {o.decision.extra["shape"]["input_ids"][1] for o in outs} == {40}
        at_40 = graph.load(path, shapes.binding_from(dims=["seq=40"]))
        np.testing.assert_array_equal(dev.table_for(sig).bytes[:-1], [c.bytes for c in at_40.cuts()][:-1])
        ref = dev.local.run_local(tokens(40))
        assert all(rel_err(ref[k], outs[0].outputs[k]) < 1e-5 for k in ref)


def test_a_shape_the_graph_cannot_be_rebound_at_is_planned_with_the_profiled_table(
    mg: graph.ModelGraph, monkeypatch: pytest.MonkeyPatch
) -> None:
    from splitrt.errors import ModelError

    def fail(*_a: object, **_k: object) -> None:
        raise ModelError("shape inference at the bound shapes failed: (test)")

    monkeypatch.setattr(rebind, "cut_costs_at", fail)
    with runtime(mg, None, policy="fixed:device") as dev:
        out = dev.infer(image(B))  # the request is served all the same
        assert out.decision.extra["table"] == "profiled (re-binding failed)"
        assert dev.table_for(signature({"images": B})) is dev.table
