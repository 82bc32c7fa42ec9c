"""Secure by default: the server's listening choices, uploads, tokens (constant time, never logged, private
files) and what --advertise announces. Real gRPC servers on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest

from splitrt.cloud.guard import auth, security
from splitrt.cloud.server import CloudServer, ServerConfig, tokens_from_file
from splitrt.device.client import Device, DeviceConfig
from splitrt.errors import CloudError, ConfigError, DiscoveryError
from splitrt.graph import zoo
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

# Uploads are checked in the checker's child: started once per session, answering before the first test.
pytestmark = pytest.mark.usefixtures("checker_child")

SECRET = "correct-horse-battery-staple"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    key, cert = d / "key.pem", d / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _status(address: str, token: str | None = None) -> pb.StatusReply:
    md = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.SplitInferenceStub(ch).Status(pb.StatusRequest(), timeout=10, metadata=md)


# -- where the server listens -------------------------------------------------------------------------


def test_default_config_listens_on_loopback_and_reports_secure(models_dir: Path) -> None:
    cfg = ServerConfig(models_dir=models_dir)
    assert cfg.host == "127.0.0.1" and not cfg.insecure and not cfg.allow_upload
    with CloudServer(cfg) as s:
        assert s.address.startswith("127.0.0.1:")
        st = _status(s.address)
        assert not st.insecure and st.security_warning == ""


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_addresses(host: str) -> None:
    assert security.is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "[::]", "10.0.0.5", "192.168.1.2", "myhost.example"])
def test_network_addresses(host: str) -> None:
    assert not security.is_loopback(host)


@pytest.mark.parametrize(
    ("extra", "missing"),
    [
        ({}, "neither TLS nor a bearer token"),
        ({"tokens": ("t0ken-t0ken",)}, "no TLS"),
    ],
)
def test_off_loopback_without_tls_and_token_needs_insecure(
    models_dir: Path, extra: dict[str, Any], missing: str
) -> None:
    with pytest.raises(
        ConfigError, match=f"--host 0.0.0.0: listening beyond loopback expected TLS .* got {missing}; .*pass --insecure"
    ):
        CloudServer(ServerConfig(models_dir=models_dir, host="0.0.0.0", **extra))


def test_off_loopback_with_tls_but_no_token_needs_insecure(models_dir: Path, tls_pair: tuple[Path, Path]) -> None:
    cert, key = tls_pair
    with pytest.raises(ConfigError, match="got no bearer token"):
        CloudServer(ServerConfig(models_dir=models_dir, host="0.0.0.0", tls_cert_path=cert, tls_key_path=key))


def test_insecure_server_warns_at_start_and_in_status(models_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.INFO, logger="splitrt.cloud"),
        CloudServer(ServerConfig(models_dir=models_dir, host="0.0.0.0", insecure=True)) as s,
    ):
        st = _status(s.address)
        assert not s.secure
    assert st.insecure
    assert "listening on 0.0.0.0 (beyond loopback) with neither TLS nor a bearer token" in st.security_warning
    warned = [r for r in caplog.records if '"event": "insecure"' in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "requests travel unencrypted and anyone who can reach it may use it" in warned[0].getMessage()


def test_off_loopback_with_tls_and_token_needs_no_flag(
    models_dir: Path, tls_pair: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = tls_pair
    cfg = ServerConfig(
        models_dir=models_dir, host="0.0.0.0", tls_cert_path=cert, tls_key_path=key, tokens=("t0ken-t0ken",)
    )
    with caplog.at_level(logging.INFO, logger="splitrt.cloud"), CloudServer(cfg) as s:
        assert s.secure and not s.exposure.insecure
        with Device(
            zoo.get("tiny_chain"), f"localhost:{s.port}", config=DeviceConfig(tls_ca_path=cert, token="t0ken-t0ken")
        ) as dev:
            st = dev.status()
            assert not st.insecure and st.security_warning == ""
    assert not any('"event": "insecure"' in r.getMessage() for r in caplog.records)


# -- uploads ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("insecure", [False, True])
def test_upload_without_token_is_refused(tmp_path: Path, insecure: bool) -> None:
    with pytest.raises(
        ConfigError,
        match=r"--allow-upload: expected a bearer token \(--token-file\) with uploads, "
        "got none",
    ):
        CloudServer(ServerConfig(models_dir=tmp_path, allow_upload=True, insecure=insecure))
    CloudServer(ServerConfig(models_dir=tmp_path, allow_upload=True, tokens=("t0ken-t0ken",)))  # with one: fine


def test_upload_needs_the_token_on_the_call(tmp_path: Path) -> None:
    with CloudServer(ServerConfig(models_dir=tmp_path, allow_upload=True, tokens=(SECRET,))) as s:
        with Device(zoo.get("tiny_chain"), s.address) as anonymous, pytest.raises(CloudError) as info:
            anonymous.upload_model()
        assert info.value.code == "UNAUTHENTICATED"
        assert list(tmp_path.iterdir()) == []
        with Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(token=SECRET)) as dev:
            assert not dev.upload_model().already_present
        assert [p.name for p in tmp_path.iterdir()] == [f"{dev.sha256}.onnx"]


# -- tokens ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o620, 0o601])
def test_token_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    f = tmp_path / "tokens"
    f.write_text(f"{SECRET}\n")
    f.chmod(mode)
    with pytest.raises(ConfigError) as info:
        tokens_from_file(f)
    msg = str(info.value)
    assert str(f) in msg and f"{mode:04o}" in msg and f"chmod 600 {f}" in msg
    assert SECRET not in msg
    f.chmod(0o600)
    assert tokens_from_file(f) == (SECRET,)
    f.chmod(0o400)
    assert tokens_from_file(f) == (SECRET,)


def test_token_file_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a regular file, got a directory"):
        tokens_from_file(tmp_path)
    with pytest.raises(ConfigError, match="cannot read"):
        tokens_from_file(tmp_path / "missing")


class _Counting:
    """Wraps ``hmac.compare_digest`` to count calls (and still compare)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.calls = 0

    def __call__(self, a: bytes, b: bytes) -> bool:
        self.calls += 1
        assert len(a) == len(b) == 32, "digests are compared, so lengths never differ"
        return bool(self.real(a, b))


@pytest.fixture()
def compare(monkeypatch: pytest.MonkeyPatch) -> _Counting:
    counting = _Counting(auth.hmac.compare_digest)
    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    return counting


def test_token_match_compares_every_token_in_constant_time(compare: _Counting) -> None:
    tokens = (b"first", b"second-longer", b"third")
    for given, ok in [(b"first", True), (b"third", True), (b"nope", False), (b"", False), (b"firs", False)]:
        compare.calls = 0
        assert auth.token_matches(given, tokens) is ok
        assert compare.calls == len(tokens), given  # no early exit on a match or a length mismatch


def test_server_checks_tokens_with_compare_digest(models_dir: Path, compare: _Counting) -> None:
    with CloudServer(ServerConfig(models_dir=models_dir, tokens=("a-token-ok", SECRET))) as s:
        compare.calls = 0
        _status(s.address, "a-token-ok")
        assert compare.calls == 2
        with pytest.raises(grpc.RpcError) as info:
            _status(s.address, "wrong")
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_tokens_are_never_logged_nor_in_a_repr(
    models_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = ServerConfig(models_dir=tmp_path, tokens=(SECRET,), allow_upload=True, host="0.0.0.0", insecure=True)
    assert SECRET not in repr(cfg) and SECRET not in repr(auth.Tokens(cfg.tokens))
    shutil.copyfile(models_dir / "tiny_chain.onnx", tmp_path / "tiny_chain.onnx")
    with caplog.at_level(logging.DEBUG), CloudServer(cfg) as s:
        assert SECRET not in repr(s.door)
        for token in (SECRET, SECRET + "x", "x" + SECRET, None):
            with Device(zoo.get("tiny_chain"), s.address, config=DeviceConfig(token=token, timeout_s=10)) as dev:
                try:
                    dev.run(dev.random_inputs(), cut="c2")
                    dev.upload_model()
                except CloudError as exc:
                    assert exc.code == "UNAUTHENTICATED" and SECRET not in str(exc)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert '"event": "unauthenticated"' in text and '"event": "infer"' in text
    assert SECRET not in text


# -- advertising -----------------------------------------------------------------------------------------


class _FakeAdvertiser:
    """Stands in for ``discovery.Advertiser`` (no network): records what would be announced."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, name: str, port: int, addresses: list[str], **kw: Any) -> None:
        from splitrt.transport.discovery import encode_txt

        self.name = name
        self.txt = encode_txt(version="x", models=kw["models"], load=kw["load"], secure=kw.get("secure"))
        _FakeAdvertiser.made.append({"addresses": addresses, **kw, "txt": self.txt})

    def update(self, **kw: Any) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture()
def fake_advertiser(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    from splitrt.transport import discovery

    _FakeAdvertiser.made = []
    monkeypatch.setattr(discovery, "Advertiser", _FakeAdvertiser)
    yield _FakeAdvertiser.made


def test_advertised_txt_says_whether_the_server_is_secure(
    models_dir: Path, tls_pair: tuple[Path, Path], fake_advertiser: list[dict[str, Any]]
) -> None:
    from splitrt.cloud.advertise import ServerAdvertiser

    cert, key = tls_pair
    open_cfg = ServerConfig(models_dir=models_dir, host="0.0.0.0", insecure=True)
    behind_relay = ServerConfig(models_dir=models_dir)  # loopback, announced at a relay's address
    locked = ServerConfig(
        models_dir=models_dir, host="0.0.0.0", tls_cert_path=cert, tls_key_path=key, tokens=("t0ken-t0ken",)
    )
    for cfg, addresses, secure in [
        (open_cfg, ["10.9.8.7"], "0"),
        (behind_relay, ["10.9.8.7"], "0"),
        (locked, ["10.9.8.7"], "1"),
    ]:
        with CloudServer(cfg) as s:
            adv = ServerAdvertiser(s, name="c", addresses=addresses, every_s=60)
            adv.close()
            assert adv.secure is (secure == "1")
        assert fake_advertiser[-1]["txt"]["secure"] == secure


def test_advertising_a_loopback_only_server_is_refused(models_dir: Path, fake_advertiser: list[dict[str, Any]]) -> None:
    from splitrt.cloud.advertise import ServerAdvertiser

    with (
        CloudServer(ServerConfig(models_dir=models_dir)) as s,
        pytest.raises(DiscoveryError, match=r"got --host 127\.0\.0\.1: only this machine can connect"),
    ):
        ServerAdvertiser(s, name="c")
    assert fake_advertiser == []


# -- secrets and what errors reveal ------------------------------------------------------------------------


def test_a_tls_key_others_can_read_is_refused(models_dir: Path, tls_pair: tuple[Path, Path]) -> None:
    cert, key = tls_pair
    key.chmod(0o644)
    try:
        with pytest.raises(ConfigError, match=r"TLS private key .*permissions 0644 are too open.*chmod 600"):
            CloudServer(ServerConfig(models_dir=models_dir, tls_cert_path=cert, tls_key_path=key))
    finally:
        key.chmod(0o600)
    CloudServer(ServerConfig(models_dir=models_dir, tls_cert_path=cert, tls_key_path=key))  # 0600: fine


def test_metrics_beyond_loopback_need_an_explicit_flag(models_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(
        ConfigError,
        match=r"--metrics-host 0.0.0.0: serving metrics beyond loopback expected "
        "--metrics-public",
    ):
        CloudServer(ServerConfig(models_dir=models_dir, metrics_port=0, metrics_host="0.0.0.0"))
    CloudServer(ServerConfig(models_dir=models_dir, metrics_port=None, metrics_host="0.0.0.0"))  # no metrics: fine
    with (
        caplog.at_level(logging.WARNING, "splitrt.cloud"),
        CloudServer(
            ServerConfig(models_dir=models_dir, metrics_port=0, metrics_host="0.0.0.0", metrics_public=True)
        ) as s,
    ):
        assert s.metrics_url is not None
    assert any('"event": "metrics_public"' in r.getMessage() for r in caplog.records)


def test_a_token_file_with_a_bom_keeps_its_first_token(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_bytes("\ufefffirst-token\nsecond\n".encode())
    f.chmod(0o600)
    assert tokens_from_file(f) == ("first-token", "second")


def test_errors_do_not_reveal_the_models_directory(tmp_path: Path) -> None:
    import hashlib

    import onnx
    from onnx import TensorProto, helper

    models = tmp_path / "secret-place" / "models"
    models.mkdir(parents=True)
    node = helper.make_node("NoSuchOp", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    data = helper.make_model(graph).SerializeToString()
    (models / "bad.onnx").write_bytes(data)
    onnx.load_from_string(data)  # parses: the store serves it, loading it fails
    with CloudServer(ServerConfig(models_dir=models)) as s, grpc.insecure_channel(s.address) as ch:
        req = pb.InferRequest(model_sha256=hashlib.sha256(data).hexdigest(), cut_id="c1")
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.SplitInferenceStub(ch).Infer(req, timeout=10)
    assert info.value.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
    details = str(info.value.details())
    assert "secret-place" not in details and str(tmp_path) not in details, details
