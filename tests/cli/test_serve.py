"""`splitrt serve` is secure by default: loopback unless told, --insecure to open it up without TLS and a
token, no uploads without a token, no readable token files. Refusals exit 2 before listening."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from splitrt.cli import app as cli
from splitrt.cli.serve import server_config
from splitrt.cloud.server import CloudServer
from splitrt.errors import ConfigError
from splitrt.graph import zoo
from splitrt.rig.cloudserver import ServerProcess, start_server
from splitrt.transport import splitrt_pb2 as pb
from splitrt.transport import splitrt_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


def test_default_host_is_loopback() -> None:
    args = cli.build_parser().parse_args(["serve", "--models", "x"])
    assert args.host == "127.0.0.1" and not args.insecure and not args.allow_upload


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--host", "0.0.0.0"],
            "--host 0.0.0.0: listening beyond loopback expected TLS (--tls-cert/--tls-key) and a "
            "bearer token (--token-file), got neither TLS nor a bearer token",
        ),
        (["--host", "10.1.2.3"], "or pass --insecure to serve anyone who can reach this address"),
        (["--allow-upload"], "--allow-upload: expected a bearer token (--token-file) with uploads, got none"),
        (["--allow-upload", "--host", "0.0.0.0", "--insecure"], "--allow-upload: expected a bearer token"),
        (["--advertise"], "--advertise: expected a server devices can reach"),
    ],
)
def test_open_choices_are_refused(models_dir: Path, argv: list[str], message: str) -> None:
    args = cli.build_parser().parse_args(["serve", "--models", str(models_dir), "--port", "0", *argv])
    with pytest.raises(ConfigError) as info:
        server_config(args)
    assert message in str(info.value)


def test_readable_token_file_is_refused(models_dir: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("s3cret-value\n")
    tokens.chmod(0o644)
    args = cli.build_parser().parse_args(["serve", "--models", str(models_dir), "--token-file", str(tokens)])
    with pytest.raises(ConfigError) as info:
        server_config(args)
    err = str(info.value)
    assert f"token file {tokens}: permissions 0644 are too open" in err and f"chmod 600 {tokens}" in err
    assert "s3cret-value" not in err


def test_serve_refuses_to_open_up_and_exits_2(models_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", "splitrt.cli", "serve", "--models", str(models_dir), "--port", "0", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2, r.stderr
    assert "listening beyond loopback expected TLS" in r.stderr and "--insecure" in r.stderr


def serve_checkout(models_dir: Path, *flags: str) -> ServerProcess:
    """This checkout's `splitrt serve` on a port of its choosing (``rig.cloudserver.start_server``), once it
    listens; its JSON-line log events are read from stderr (``.event(name)``, ``.events``)."""
    return start_server(
        models_dir, *flags, port=0, pythonpath=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout_s=120
    )


def _status(port: int) -> pb.StatusReply:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return pb_grpc.SplitInferenceStub(ch).Status(pb.StatusRequest(), timeout=10)


def test_serve_listens_on_loopback_by_default(models_dir: Path) -> None:
    s = serve_checkout(models_dir, "--workers", "1")
    try:
        ev = s.event("listening")
        assert ev["host"] == "127.0.0.1" and ev["insecure"] is False
        st = _status(ev["port"])
        assert not st.insecure and len(st.models) == 1
        assert not any(e.get("event") == "insecure" for e in s.events)
    finally:
        assert s.stop() == 0


def test_serve_insecure_says_so_in_its_log_and_status(models_dir: Path) -> None:
    s = serve_checkout(models_dir, "--workers", "1", "--host", "0.0.0.0", "--insecure")
    try:
        ev = s.event("listening")
        assert ev["host"] == "0.0.0.0" and ev["insecure"] is True and ev["tls"] is False and ev["auth"] is False
        warning = s.event("insecure")
        assert "neither TLS nor a bearer token" in warning["warning"]
        st = _status(ev["port"])
        assert st.insecure and st.security_warning == warning["warning"]
    finally:
        assert s.stop() == 0


def _commands(text: str) -> list[list[str]]:
    """Every `splitrt serve` command in ``text`` (shell blocks, continuation lines joined)."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split(" # ")[0].strip()
        if "splitrt serve " in line and not line.startswith("#"):
            out.append(shlex.split(line[line.index("splitrt serve ") + len("splitrt ") :]))
    return out


@pytest.fixture()
def operator_files(tmp_path: Path) -> dict[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    d = tmp_path / "etc" / "splitrt"
    d.mkdir(parents=True)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(d / "key.pem"),
            "-out",
            str(d / "cert.pem"),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
        ],
        check=True,
        capture_output=True,
    )
    (d / "tokens").write_text("a-token-for-tests\n")
    (d / "tokens").chmod(0o600)
    shutil.copyfile(d / "tokens", d / "cloud-token")  # the edge's token for the next tier (the docs' --next line)
    (d / "cloud-token").chmod(0o600)
    models = tmp_path / "models"
    models.mkdir()
    return {
        "/srv/models": str(models),
        "@PREFIX@/var/lib/models": str(models),
        "@PREFIX@/etc/splitrt/": f"{d}/",
        "cert.pem": str(d / "cert.pem"),
        "key.pem": str(d / "key.pem"),
        "tokens.txt": str(d / "tokens"),
        "cloud-token.txt": str(d / "cloud-token"),
        "cloud-cert.pem": str(d / "cert.pem"),
    }


def test_readme_and_systemd_serve_commands_are_accepted(operator_files: dict[str, str]) -> None:
    from tests.test_readme import docs_text

    readme = _commands("\n".join(re.findall(r"```sh\n(.*?)```", docs_text(), flags=re.S)))
    unit = _commands((REPO / "devices" / "systemd" / "splitrt-cloud.service").read_text())
    assert len(readme) >= 2 and len(unit) == 1  # every serve command in the README and docs/, edge tier included
    assert "--tls-cert" in readme[0] and "--token-file" in readme[0]  # the secure command comes first
    for argv in readme + unit:
        args = []
        for a in argv:
            for old, new in operator_files.items():
                a = a.replace(old, new) if old.startswith(("/", "@")) else (new if a == old else a)
            args.append(a)
        parsed = cli.build_parser().parse_args(args)
        config = server_config(parsed)
        assert not CloudServer(config).exposure.insecure, argv
