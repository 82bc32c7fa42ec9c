"""The edge tier (``splitrt serve --next``): real servers on 127.0.0.1 (ephemeral ports), a device in front.

The relay must compose exactly (outputs equal the full model's) for every kind of cut pair, refuse a
second cut before the first with INVALID_ARGUMENT naming both, and finish requests itself when its next
tier dies (nothing lost, same outputs).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from splitrt.cli import app as cli
from splitrt.cli.serve import server_config
from splitrt.cloud.handler.nexthop import NextTier
from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.device.client import Device
from splitrt.errors import CloudError
from splitrt.graph import model as graph_mod
from splitrt.graph import zoo
from tests.conftest import rel_err


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    shutil.copyfile(zoo.get("multi_io"), d / "multi_io.onnx")
    return d


@pytest.fixture(scope="module")
def tiers(models_dir: Path) -> Iterator[tuple[CloudServer, CloudServer]]:
    cloud = CloudServer(ServerConfig(models_dir=models_dir, workers=2))
    cloud.start()
    edge = CloudServer(ServerConfig(models_dir=models_dir, workers=2, next_tier=NextTier(address=cloud.address)))
    edge.start()
    yield edge, cloud
    edge.stop(grace_s=0)
    cloud.stop(grace_s=0)


def _pairs(model: str) -> list[tuple[str, str]]:
    ids = [c.id for c in graph_mod.load(zoo.get(model)).cuts()]
    mid = ids[len(ids) // 2]
    # graph inputs forwarded untouched, an empty middle, a real middle, the edge finishing, the last cut
    return [("cloud", "cloud"), ("cloud", mid), (ids[1], ids[-2]), (mid, mid), (ids[1], "device"), (ids[-2], ids[-2])]


@pytest.mark.parametrize("model", ["tiny_chain", "multi_io"])
def test_relay_composes_exactly_for_cut_pairs(tiers: tuple[CloudServer, CloudServer], model: str) -> None:
    edge, cloud = tiers
    with Device(zoo.get(model), edge.address) as dev:
        x = dev.random_inputs(seed=3)
        ref = dev.run_local(x)
        served_before = cloud.served
        for first, second in _pairs(model):
            res = dev.send(dev.run_head(x, first), next_cut=second)
            for name, want in ref.items():
                assert rel_err(want, res.outputs[name]) <= 1e-5, (first, second, name)
            hops = res.hops
            assert hops is not None and not hops.next_error_code
            assert hops.forwarded == (second != "device"), (first, second)
            assert hops.edge_ms >= hops.next_ms >= 0
            # each pair is new to the edge: its middle segment's session build is build_ms, not queue_ms
            assert res.build_ms > 0 and res.queue_ms + res.build_ms <= hops.edge_ms
            if hops.forwarded:
                assert hops.next_address == cloud.address and hops.next_bytes_up > 0
        assert cloud.served - served_before == sum(s != "device" for _, s in _pairs(model))


def test_second_cut_before_the_first_is_invalid_argument(tiers: tuple[CloudServer, CloudServer]) -> None:
    edge, _ = tiers
    with Device(zoo.get("tiny_chain"), edge.address) as dev:
        head = dev.run_head(dev.random_inputs(), "c4")
        with pytest.raises(CloudError) as info:
            dev.send(head, next_cut="c2")
        assert info.value.code == "INVALID_ARGUMENT"
        assert "next_cut_id 'c2' is before cut_id 'c4'" in str(info.value)
        with pytest.raises(CloudError) as info:
            dev.send(head, next_cut="c99")
        assert info.value.code == "NOT_FOUND" and "c99" in str(info.value)
        # still serving
        x = dev.random_inputs(seed=1)
        assert rel_err(dev.run_local(x)["y"], dev.send(dev.run_head(x, "c2"), next_cut="c4").outputs["y"]) <= 1e-5


def test_status_and_probe_report_the_next_tier(tiers: tuple[CloudServer, CloudServer]) -> None:
    edge, cloud = tiers
    with Device(zoo.get("tiny_chain"), edge.address) as dev:
        assert dev.status().next_address == cloud.address
        p = dev.probe(64, 64, next_bytes=(32 * 1024, 64))
        assert p.next_ms is not None and p.next_ms > 0 and p.next_error == ""
        assert p.next_load is not None and p.next_load.workers == 2
        plain = dev.probe(64, 64)
        assert plain.next_ms is None


def test_a_server_without_next_tier_finishes_the_request(models_dir: Path) -> None:
    with CloudServer(ServerConfig(models_dir=models_dir)) as lone, Device(zoo.get("tiny_chain"), lone.address) as dev:
        x = dev.random_inputs(seed=2)
        res = dev.send(dev.run_head(x, "c1"), next_cut="c3")
        assert rel_err(dev.run_local(x)["y"], res.outputs["y"]) <= 1e-5
        assert res.hops is not None and not res.hops.forwarded and "no next tier" in res.hops.next_error
        assert dev.status().next_address == ""
        assert "no next tier" in dev.probe(64, 64, next_bytes=(64, 64)).next_error


def test_next_tier_dies_mid_test_the_edge_finishes(models_dir: Path) -> None:
    cloud = CloudServer(ServerConfig(models_dir=models_dir))
    cloud.start()
    edge = CloudServer(ServerConfig(models_dir=models_dir, next_tier=NextTier(address=cloud.address)))
    edge.start()
    try:
        with Device(zoo.get("tiny_chain"), edge.address) as dev:
            x = dev.random_inputs(seed=5)
            ref = dev.run_local(x)["y"]
            ok = dev.send(dev.run_head(x, "c1"), next_cut="c3")
            assert ok.hops is not None and ok.hops.forwarded
            cloud.stop(grace_s=0)
            for first, second in [("c1", "c3"), ("cloud", "c2"), ("c2", "c2")]:  # the first tries, the rest back off
                res = dev.send(dev.run_head(x, first), next_cut=second)
                assert rel_err(ref, res.outputs["y"]) <= 1e-5
                assert res.hops is not None and not res.hops.forwarded
                assert res.hops.next_error_code == "UNAVAILABLE", res.hops.next_error
            assert edge.next_hop.finished_here == 3
            p = dev.probe(64, 64, next_bytes=(64, 64))
            assert p.next_ms is None and "UNAVAILABLE" in p.next_error
    finally:
        edge.stop(grace_s=0)
        cloud.stop(grace_s=0)


def test_the_middle_segment_is_leased_while_it_runs(models_dir: Path) -> None:
    """A request with a next cut runs its segment on the one request path: leased (not evictable) while it
    runs, like a tail, and released after; its fallback tail too."""
    seen: list[dict[str, int]] = []
    with CloudServer(ServerConfig(models_dir=models_dir)) as lone, Device(zoo.get("tiny_chain"), lone.address) as dev:

        def look(header: object) -> None:
            with lone.tails._lock:
                seen.append({k[1]: t.users for k, t in lone.tails._cache.items()})

        lone.handler.before_tail = look
        x = dev.random_inputs(seed=4)
        res = dev.send(dev.run_head(x, "c1"), next_cut="c3")
        assert rel_err(dev.run_local(x)["y"], res.outputs["y"]) <= 1e-5
        assert seen == [{"c1>c3": 1}, {"c1>c3": 0, "c3": 1}], seen  # the segment, then c3's tail here
        assert lone.tails.evict(1 << 40) > 0  # nothing in use afterwards: everything evictable
        assert lone.tails.snapshot() == []


def test_serve_next_flags(models_dir: Path, tmp_path: Path) -> None:
    token = tmp_path / "next-token.txt"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    args = cli.build_parser().parse_args(
        [
            "serve",
            "--models",
            str(models_dir),
            "--port",
            "0",
            "--next",
            "10.0.0.9:50061",
            "--next-token-file",
            str(token),
        ]
    )
    cfg = server_config(args)
    assert cfg.next_tier is not None and cfg.next_tier.address == "10.0.0.9:50061"
    assert cfg.next_tier.token == "s3cret" and "s3cret" not in repr(cfg)
    plain = server_config(cli.build_parser().parse_args(["serve", "--models", str(models_dir), "--port", "0"]))
    assert plain.next_tier is None


def test_stock_client_sees_the_new_fields(tiers: tuple[CloudServer, CloudServer]) -> None:
    """A stock protobuf client (generated stub) can send a three-tier request and read the hops."""
    from splitrt.transport import codec, wire
    from splitrt.transport import splitrt_pb2_grpc as pb_grpc

    edge, cloud = tiers
    with Device(zoo.get("tiny_chain"), edge.address) as dev:
        head = dev.run_head(dev.random_inputs(), "c2")
        request = dev._remote.request(head, codec.Codec.parse("fp32"), "c4", "fp16")[0].to_message()
        stub = pb_grpc.SplitInferenceStub(grpc.insecure_channel(edge.address, wire.channel_options(1 << 26, 30.0)))
        reply = stub.Infer(request, timeout=10)
        assert reply.next_address == cloud.address and reply.next_bytes_up > 0 and len(reply.outputs) == 1


def test_readme_three_tier_commands_parse(models_dir: Path) -> None:
    """The docs' `serve --next` lines (not run by tests/test_readme.py: they serve) parse, and the
    loopback one makes an edge config."""
    from tests.test_readme import doc_commands

    lines = [c for c in doc_commands() if c[1] == "serve" and "--next" in c]
    assert len(lines) == 2
    for argv in lines:
        args = cli.build_parser().parse_args([a.replace("/srv/models", str(models_dir)) for a in argv[1:]])
        assert args.next and args.func.__name__ == "cmd_serve"
        if not args.token_file:
            assert server_config(args).next_tier == NextTier(address=args.next)


def test_a_slow_next_tier_backs_off_only_at_the_second_timeout(models_dir: Path) -> None:
    """A forward that times out may be the request's short deadline: the edge finishes it and tries the
    next tier again; two in a row and it backs off (finishing at once, UNAVAILABLE)."""
    import threading

    release = threading.Event()
    cloud = CloudServer(ServerConfig(models_dir=models_dir, workers=4))
    cloud.handler.before_tail = lambda header: release.wait(10)  # type: ignore[assignment,return-value]
    cloud.start()
    edge = CloudServer(
        ServerConfig(
            models_dir=models_dir, next_tier=NextTier(address=cloud.address, timeout_s=0.3, backoff_initial_s=60.0)
        )
    )
    edge.start()
    try:
        with Device(zoo.get("tiny_chain"), edge.address) as dev:
            x = dev.random_inputs(seed=6)
            ref = dev.run_local(x)["y"]
            codes = []
            for _ in range(3):
                res = dev.send(dev.run_head(x, "c1"), next_cut="c3")
                assert rel_err(ref, res.outputs["y"]) <= 1e-5 and res.hops is not None
                codes.append(res.hops.next_error_code)
            assert codes == ["DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED", "UNAVAILABLE"]
    finally:
        release.set()
        edge.stop(grace_s=0)
        cloud.stop(grace_s=0)
