"""deploy/proxy/haproxy.cfg, the edge proxy's shipped configuration, run by the real HAProxy binary in front
of a real ``splitrt serve`` on loopback: TLS and HTTP/2 in, gRPC through to the server, Infer answers
as the local run does; the server sees each device's address (x-forwarded-for from a trusted proxy), so a token guesser
is throttled alone; an address's connections, streams per connection, silent connections and request rate are
capped at the proxy (the server no longer caps connections itself). Skips when the
``haproxy`` or ``openssl`` binary is absent (``.ci/run`` installs haproxy on a fresh CI machine)."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import ssl
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from splitrt.device.client import Device, DeviceConfig
from splitrt.graph import zoo
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc
from splitrt.transport import wire
from tests.loopback import free_port, reap, serve
from tests.rawh2 import RawConnection
from tests.relay import SourceRelay

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "proxy" / "haproxy.cfg"
TOKEN = "pr0xy-t0ken-" + "x" * 20


def _haproxy() -> str:
    found = shutil.which("haproxy")
    if found is None:
        pytest.skip("haproxy not installed (apt-get install -y haproxy; .ci/run does it as root)")
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    return found


@dataclass
class Edge:
    address: str  # the proxy (TLS)
    server_address: str  # the server behind it (plaintext, loopback)
    ca: Path
    proxy: subprocess.Popen[bytes]

    @contextlib.contextmanager
    def device(self, source: str | None = None) -> Iterator[Device]:
        """A device through the proxy; from ``source`` (another loopback address, through a relay)."""
        relay = None if source is None else SourceRelay(self.address, source)
        config = DeviceConfig(token=TOKEN, tls_ca_path=self.ca, tls_server_name="localhost", timeout_s=20)
        try:
            with Device(zoo.get("tiny_chain"), self.address if relay is None else relay.address, config=config) as d:
                yield d
        finally:
            if relay is not None:
                relay.close()

    def channel(self) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(self.ca.read_bytes())
        return grpc.secure_channel(
            self.address,
            creds,
            options=[("grpc.ssl_target_name_override", "localhost"), ("grpc.use_local_subchannel_pool", 1)],
        )


def _certificate(d: Path) -> tuple[Path, Path]:
    key, cert = d / "tls.key", d / "tls.crt"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)),
            *("-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    pem = d / "proxy.pem"  # HAProxy's form: the chain, then the key
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    pem.chmod(0o600)
    return cert, pem


def _listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise AssertionError(f"haproxy exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"haproxy did not listen on 127.0.0.1:{port}")


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    haproxy = _haproxy()
    d = tmp_path_factory.mktemp("edge")
    models = d / "models"
    models.mkdir()
    shutil.copyfile(zoo.get("tiny_chain"), models / "tiny_chain.onnx")
    tokens = d / "tokens.txt"
    tokens.write_text(TOKEN + "\n")
    tokens.chmod(0o600)
    cert, pem = _certificate(d)
    server_port, proxy_port, stats_port = free_port(), free_port(), free_port()
    # An address may hold 128 inference calls (64 by default): the stream-cap test's 100 stay open at the server.
    extra = ["--token-file", str(tokens), "--trusted-proxy", "127.0.0.1", "--calls-per-peer", "128"]
    server = serve(models, server_port, extra=extra)
    env = {
        **os.environ,
        "SPLITRT_PROXY_BIND": f"127.0.0.1:{proxy_port}",
        "SPLITRT_PROXY_CERT": str(pem),
        "SPLITRT_BACKEND": f"127.0.0.1:{server_port}",
        "SPLITRT_PROXY_STATS": f"127.0.0.1:{stats_port}",
    }
    log = d / "haproxy.log"
    with open(log, "wb") as out:  # its access log (stdout): a file, never a pipe nobody reads
        proxy = subprocess.Popen([haproxy, "-db", "-f", str(CONFIG)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _listening(proxy_port, proxy, log)
        yield Edge(f"127.0.0.1:{proxy_port}", f"127.0.0.1:{server_port}", cert, proxy)
    finally:
        proxy.terminate()
        reap(proxy)
        server.terminate()
        reap(server, 30)


def test_the_shipped_configuration_checks_clean(edge: Edge) -> None:
    r = subprocess.run(
        [_haproxy(), "-c", "-f", str(CONFIG)],
        env={
            **os.environ,
            "SPLITRT_PROXY_BIND": "127.0.0.1:1",
            "SPLITRT_PROXY_CERT": str(edge.ca.parent / "proxy.pem"),
            "SPLITRT_BACKEND": "127.0.0.1:2",
            "SPLITRT_PROXY_STATS": "127.0.0.1:3",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "WARNING" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_infer_through_the_proxy_matches_the_local_run(edge: Edge) -> None:
    """Real Infer calls over TLS and HTTP/2 to the proxy, through it to the server: at every cut the outputs
    are the whole model's run here (to float rounding: the segments' kernels differ); the server counts them."""
    with edge.device() as dev:
        x = dev.random_inputs()
        local = dev.run_local(x)
        for cut in [c.id for c in dev.graph.cuts()][:-1]:
            got = dev.run_detailed(x, cut=cut)
            assert got.where == "cloud", got
            for name, value in local.items():
                np.testing.assert_allclose(got.outputs[name], value, rtol=1e-5, atol=1e-6)
    with edge.channel() as ch:
        status = pb_grpc.SplitInferenceStub(ch).Status(
            pb.StatusRequest(), timeout=20, metadata=(("authorization", f"Bearer {TOKEN}"),)
        )
        assert status.served >= 1


def test_a_guesser_behind_the_proxy_is_throttled_alone(edge: Edge) -> None:
    """A client guessing tokens comes through the proxy like everyone: the server throttles its address
    (x-forwarded-for, trusted from the proxy), not the proxy's, so a device through the same proxy is
    served. (A forged x-forwarded-for is replaced by the proxy; the guesser's own is 127.0.0.1 here, the
    device's too, so the device connects from 127.0.0.2.)"""
    codes: Counter[str] = Counter()
    with edge.channel() as ch:
        stub = pb_grpc.SplitInferenceStub(ch)
        for i in range(14):
            forged = (("authorization", f"Bearer guess{i}"), ("x-forwarded-for", "203.0.113.9"))
            with pytest.raises(grpc.RpcError) as info:
                stub.Status(pb.StatusRequest(), timeout=20, metadata=forged)
            codes[info.value.code().name] += 1
    assert codes["UNAUTHENTICATED"] == 11 and codes["RESOURCE_EXHAUSTED"] == 3, codes
    # The device from another address: its token is checked, not throttled with the guesser's.
    with edge.device(source="127.0.0.2") as dev:
        assert dev.run_detailed(dev.random_inputs(), cut="c2").where == "cloud"


def test_an_address_holds_a_bounded_number_of_connections(edge: Edge) -> None:
    """40 TCP connections from one address: the proxy keeps 32 and closes the rest at once; a device from
    another address connects and is served."""
    host, port = edge.address.rsplit(":", 1)
    socks: list[socket.socket] = []
    refused = 0  # reset while connecting: refused before we could even look
    try:
        for _ in range(40):
            try:
                socks.append(socket.create_connection((host, int(port)), timeout=10, source_address=("127.0.0.3", 0)))
            except ConnectionResetError:
                refused += 1
        # 8 are refused: closed at once (whichever the proxy counted last). The 32 held stay silent (until
        # the proxy's 10 s header timeout: after this look).
        live = set(socks)
        for _ in range(25):
            readable, _, _ = select.select(list(live), [], [], 0.2)
            for s in readable:
                with contextlib.suppress(ConnectionResetError):
                    assert s.recv(1) == b""
                live.discard(s)
                refused += 1
        assert refused == 8 and len(live) == 32
        with edge.device(source="127.0.0.4") as dev:
            assert dev.run_detailed(dev.random_inputs(), cut="c2").where == "cloud"
    finally:
        for s in socks:
            s.close()


def test_a_request_flood_is_answered_by_the_proxy(edge: Edge) -> None:
    """2000 health checks from one address, 8 at a time (the server's share per address): past 1000
    requests in 10 s the proxy answers RESOURCE_EXHAUSTED itself (a gRPC status the devices know), and
    those never reach the server."""
    codes: Counter[str] = Counter()
    with edge.channel() as ch:
        check = health_pb2_grpc.HealthStub(ch).Check
        for _ in range(250):
            for f in [check.future(health_pb2.HealthCheckRequest(), timeout=60) for _ in range(8)]:
                try:
                    f.result()
                    codes["OK"] += 1
                except grpc.RpcError as exc:
                    by_proxy = "rate limited by the edge proxy" in str(exc.details())
                    codes[exc.code().name + (" (proxy)" if by_proxy else "")] += 1
    assert codes["OK"] >= 900 and codes["RESOURCE_EXHAUSTED (proxy)"] >= 500, codes


def _h2_tls(edge: Edge) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(edge.ca))
    ctx.set_alpn_protocols(["h2"])
    return ctx


def test_streams_beyond_the_cap_are_refused_by_the_proxy(edge: Edge) -> None:
    """The proxy announces 100 concurrent streams per connection and refuses the 101st (RST_STREAM
    REFUSED_STREAM, 7) before it reaches the server, which sets no stream cap of its own. 101 InferStream
    calls, headers only, in one write; the server holds the first 100 open (waiting for their frames), so
    however the proxy's reads and the server's answers interleave, 100 are open when the 101st comes."""
    host, port = edge.address.rsplit(":", 1)
    with RawConnection(host, int(port), tls=_h2_tls(edge), source="127.0.0.6") as raw:
        auth = [("authorization", f"Bearer {TOKEN}")]
        ids = [raw.start_call(f"/{wire.SERVICE_NAME}/InferStream", auth) for _ in range(101)]
        for _ in range(100):
            raw.pump(0.1)
            if ids[-1] in raw.reset or raw.closed:
                break
        assert raw.settings.get(3) == 100, raw.settings  # SETTINGS_MAX_CONCURRENT_STREAMS
        assert raw.reset.get(ids[-1]) == 7 and not raw.closed, (raw.reset, raw.closed)
        assert [i for i in ids[:-1] if raw.reset.get(i) == 7] == []
        assert raw.finished.isdisjoint(ids[:-1])  # the first 100 are open at the server, waiting for frames
    with edge.device(source="127.0.0.6") as dev:  # the address goes on
        assert dev.run_detailed(dev.random_inputs(), cut="c2").where == "cloud"


@pytest.mark.slow
def test_a_silent_connection_is_closed(edge: Edge) -> None:
    """Connections that send nothing are closed by the proxy, not left to the server (which has no handshake
    or idle timeout of its own): one that never starts TLS (``timeout client``, 30 s), one that stops after
    TLS and one after the HTTP/2 preface with no stream (``timeout http-request``, 10 s). The bound is a guard
    against hanging, not a timed assert."""
    host, port = edge.address.rsplit(":", 1)
    src = ("127.0.0.7", 0)
    tcp = socket.create_connection((host, int(port)), timeout=10, source_address=src)
    tls = _h2_tls(edge).wrap_socket(
        socket.create_connection((host, int(port)), timeout=10, source_address=src), server_hostname="localhost"
    )
    h2 = RawConnection(host, int(port), tls=_h2_tls(edge), source="127.0.0.7")
    closed: set[str] = set()
    try:
        end = time.monotonic() + 120
        while len(closed) < 3 and time.monotonic() < end:
            for name, s in (("tcp", tcp), ("tls", tls)):
                if name not in closed and select.select([s], [], [], 0.2)[0]:
                    try:
                        gone = s.recv(64) == b""
                    except OSError:  # reset, or TLS torn down
                        gone = True
                    if gone:
                        closed.add(name)
            h2.pump(0.2)
            if h2.closed:
                closed.add("h2")
        assert closed == {"tcp", "tls", "h2"}, closed
    finally:
        for s in (tcp, tls):
            s.close()
        h2.close()
