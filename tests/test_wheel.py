"""The wheel as a new user gets it: built from the sdist, installed into a fresh venv in a temporary directory
(cwd outside the checkout, no PYTHONPATH), then the commands of the README's first page: ``--version``
(data found in the package), ``inspect``, ``plan --board rpi4`` on shipped profiles, ``profile``, ``demo``'s
offline part, and ``serve`` + ``run`` on loopback (the split answer equal to the whole model's).

By default every command under this interpreter, and the ones that read TOML and shipped data under the
oldest supported Python (3.10, which needs ``tomli``); ``make pythons`` (``SPLITRT_PYTHONS=all``) runs every
command under every supported interpreter found on the machine, skipping the others with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from splitrt.graph import zoo
from splitrt.rig.cloudserver import start_server
from tests import wheelcheck

CURRENT = f"{sys.version_info.major}.{sys.version_info.minor}"
FULL = os.environ.get("SPLITRT_PYTHONS") == "all"
VERSIONS = wheelcheck.SUPPORTED if FULL else tuple(dict.fromkeys((CURRENT, wheelcheck.SUPPORTED[0])))
BOARDS = {"jetson-nano", "jetson-orin-nano", "rpi4", "rpi5", "x86"}
PROFILE = "x86_64-2core__squeezenet.json"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return wheelcheck.build_wheel(tmp_path_factory.mktemp("build"))


def test_sdist_and_wheel_carry_the_shipped_data(built: tuple[Path, Path]) -> None:
    sdist, wheel = built
    with tarfile.open(sdist) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    with zipfile.ZipFile(wheel) as z:
        in_wheel = set(z.namelist())
    for board in BOARDS:
        assert f"devices/{board}.toml" in in_sdist
        assert f"splitrt/data/devices/{board}.toml" in in_wheel
    assert "devices/install.sh" in in_sdist and "devices/systemd/splitrt-daemon.service" in in_sdist
    shipped = {p.name for p in (wheelcheck.REPO / "profiles").glob("*.json")}
    assert shipped and {f"splitrt/data/profiles/{n}" for n in shipped} <= in_wheel
    assert any(n.startswith("splitrt/data/traces/hsdpa/") for n in in_wheel)
    # the zoo's default accuracy samples (profile --samples zoo) and their licences
    assert {"splitrt/data/samples/README.md", "splitrt/data/samples/coffee.jpg"} <= in_wheel
    meta = next(z for z in in_wheel if z.endswith(".dist-info/METADATA"))
    with zipfile.ZipFile(wheel) as z:
        text = z.read(meta).decode()
    assert "License-Expression: Apache-2.0" in text
    assert 'Requires-Dist: tomli>=1.1; python_version < "3.11"' in text
    assert "Classifier: Programming Language :: Python :: 3.10" in text


def _splitrt(bin_dir: Path, cwd: Path, env: dict[str, str], *args: str) -> str:
    r = subprocess.run([str(bin_dir / "splitrt"), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
    assert r.returncode == 0, f"splitrt {' '.join(args)} exited {r.returncode}: {r.stderr[-3000:]}"
    return r.stdout


def _smoke(bin_dir: Path, work: Path, version: str, *, full: bool) -> None:
    env = wheelcheck.clean_env(SPLITRT_CACHE=str(work / "cache"), OMP_NUM_THREADS="1")
    site = bin_dir.parent / "lib" / f"python{version}" / "site-packages" / "splitrt"
    text = _splitrt(bin_dir, work, env, "--version")
    assert f"Python {version}." in text and "onnxruntime 1." in text and "grpcio 1." in text, text
    assert f"devices: {site}/data/devices (package)" in text and f"profiles: {site}/data/profiles (package)" in text

    models = work / "models"
    models.mkdir()
    model = models / "squeezenet.onnx"
    shutil.copyfile(zoo.get("squeezenet"), model)  # the same bytes the installed zoo makes (seeded)
    cuts = json.loads(_splitrt(bin_dir, work, env, "inspect", str(model), "--json"))["cuts"]
    ids = [c["id"] for c in cuts]
    assert ids[0] == "cloud" and ids[-1] == "device" and len(ids) > 10

    # a shipped profile by name and as the docs write it (profiles/...): neither exists under cwd;
    # the board's speed factor comes from the shipped rpi4.toml (tomli on 3.10)
    plan = json.loads(
        _splitrt(
            bin_dir,
            work,
            env,
            "plan",
            str(model),
            "--device",
            PROFILE,
            "--cloud",
            f"profiles/{PROFILE}",
            "--board",
            "rpi4",
            "--bandwidth-mbps",
            "5",
            "--rtt-ms",
            "60",
            "--json",
        )
    )
    assert plan["best"]["cut"] in ids and plan["best"]["predicted_ms"] > 0, plan["best"]
    assert plan["conditions"]["device_speed_factor"] > 2, plan["conditions"]
    # profile builds sessions from models it makes: their IR must suit the installed onnxruntime (3.10 gets 1.23)
    _splitrt(
        bin_dir,
        work,
        env,
        "profile",
        "zoo:tiny_chain",
        "--out",
        str(work / "tiny.json"),
        "--runs",
        "2",
        "--segments",
        "2",
        "--power-reader",
        "none",
    )
    assert json.loads((work / "tiny.json").read_text())["cuts"]
    if not full:
        return

    demo = json.loads(
        _splitrt(bin_dir, work, env, "demo", "--no-rig", "--model", "squeezenet", "--cuts", "2", "--json", "--plot", "")
    )
    assert len(demo["splits"]) == 2 and all(s["exact"] for s in demo["splits"]), demo

    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(work / "x.npy", x)
    mid = next(c["id"] for c in cuts[len(cuts) // 2 :] if len(c["tensors"]) == 1)
    # The installed script, on a port of its choosing (its listening event names it); the timeout is a guard
    # against hanging, not a timing assertion (RigError with the server's output).
    serve = start_server(
        models, "--workers", "1", port=0, command=[str(bin_dir / "splitrt")], cwd=work, env=env, timeout_s=120
    )
    try:
        split = json.loads(
            _splitrt(
                bin_dir,
                work,
                env,
                "run",
                str(model),
                "--cloud",
                f"127.0.0.1:{serve.port}",
                "--cut",
                mid,
                "--input",
                str(work / "x.npy"),
                "--output",
                str(work / "split.npz"),
                "--json",
            )
        )
    finally:
        code = serve.stop()
    assert code == 0, serve.output()
    assert split["where"] != "local" and split["bytes_up"] > 0, split
    got = np.load(work / "split.npz")
    assert set(got.files) == {"softmaxout_1"}
    (want,) = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(["softmaxout_1"], {"data_0": x})
    np.testing.assert_allclose(got["softmaxout_1"], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("version", VERSIONS, ids=[f"py{v}" for v in VERSIONS])
def test_installed_wheel_runs_outside_the_checkout(built: tuple[Path, Path], version: str, tmp_path: Path) -> None:
    python = wheelcheck.find_interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (looked in $PYENV_ROOT/versions and PATH)")
    bin_dir = wheelcheck.install(python, built[1], tmp_path / "venv")
    assert not str(tmp_path).startswith(str(wheelcheck.REPO))
    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import splitrt, sys; print(splitrt.__file__, sys.version)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=wheelcheck.clean_env(),
        timeout=120,
    )
    assert where.stdout.startswith(str(tmp_path / "venv")) and f" {version}." in where.stdout, where
    # every command under this interpreter; the extra one (the oldest) runs those that read TOML and data
    _smoke(bin_dir, tmp_path, version, full=version == CURRENT or FULL)


def test_version_names_the_libraries_and_data_in_use(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from splitrt.cli import app

    monkeypatch.setenv("SPLITRT_PROFILES_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        app.main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    import onnxruntime

    assert f"onnxruntime {onnxruntime.__version__}" in out
    assert f"devices: {wheelcheck.REPO / 'devices'} (checkout)" in out
    assert f"profiles: {tmp_path} ($SPLITRT_PROFILES_DIR)" in out
