"""Build splitrt as a user gets it (sdist, then a wheel from the sdist) and install the wheel into a fresh
venv outside the checkout: shared by tests/test_wheel.py and `make pythons`.

The dependencies' wheels are collected once per interpreter and requirement set into a wheelhouse under
``$XDG_CACHE_HOME/splitrt/wheelhouse`` (filled from pip's own cache), so later installs run offline
(``--no-index``) in seconds; splitrt's own wheel is built fresh every time.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUPPORTED = ("3.10", "3.11", "3.12", "3.13")


def _run(cmd: list[str], *, cwd: Path | None = None, timeout: float = 600) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would let a child see the checkout or another venv."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "SPLITRT_DEVICES_DIR", "SPLITRT_PROFILES_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def find_interpreter(version: str) -> Path | None:
    """A ``python{version}`` on this machine: pyenv's newest patch release first, then PATH."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(
        glob.glob(f"{root}/versions/{version}.*/bin/python{version}"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parents[1].name)],
    )
    if found:
        return Path(found[-1])
    which = shutil.which(f"python{version}")
    return Path(which) if which else None


def _setuptools_ok() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77


def tracked_files() -> list[str]:
    """The checkout's tracked paths (``git ls-files``), relative: what a fresh clone holds."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name]


def copy_tracked(dst: Path) -> None:
    """Copy the tracked files (their working-tree content) to ``dst``: the build sees what a fresh clone
    would, not whatever lies beside the checkout (a venv, a stray symlink, a build directory)."""
    for name in tracked_files():
        source = REPO / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet committed
        target = dst / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def build_wheel(out_dir: Path) -> tuple[Path, Path]:
    """``(sdist, wheel)``: the sdist from a copy of the checkout, the wheel from that sdist (so the wheel
    can only carry what the sdist does). Without build isolation when this interpreter's setuptools is
    recent enough (offline, ~3 s); else pip fetches the build requirements (~15 s)."""
    src = out_dir / "src"
    copy_tracked(src)
    dist = out_dir / "dist"
    dist.mkdir()
    name = (
        _run(
            [sys.executable, "-c", f"from setuptools import build_meta as b; print(b.build_sdist({str(dist)!r}))"],
            cwd=src,
        )
        .strip()
        .splitlines()[-1]
    )
    sdist = dist / name
    isolation = [] if _setuptools_ok() else ["--use-pep517"]
    no_iso = ["--no-build-isolation"] if not isolation else []
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *no_iso, *isolation, "-w", str(dist), str(sdist)],
        cwd=out_dir,
    )
    wheels = sorted(dist.glob("splitrt-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one splitrt wheel in {dist}, got {wheels}")
    return sdist, wheels[0]


def requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional ``Requires-Dist`` lines (no extras)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]


def _pip(python: Path, *args: str, timeout: float = 900) -> str:
    # this venv's pip drives the target interpreter (pip >= 22.3): the new venv needs no pip of its own
    return _run([sys.executable, "-m", "pip", "--python", str(python), *args], timeout=timeout)


def wheelhouse(python: Path, wheel: Path) -> Path:
    """The dependencies' wheels for ``python`` (cached; keyed by its version and the requirements)."""
    probe = "import sys, sysconfig; print(sys.version.split()[0], sysconfig.get_platform())"
    version = _run([str(python), "-c", probe])
    key = hashlib.sha256("\n".join([version, *requirements(wheel)]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "splitrt" / "wheelhouse"
    house = cache / f"{version.split()[0]}-{key}"
    if not (house / ".complete").is_file():
        tmp = cache / f".tmp-{os.getpid()}-{key}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _pip(python, "wheel", "-q", "--wheel-dir", str(tmp), *requirements(wheel))
        (tmp / ".complete").write_text(version)
        shutil.rmtree(house, ignore_errors=True)
        tmp.rename(house)
    return house


def install(python: Path, wheel: Path, venv: Path) -> Path:
    """A fresh venv of ``python`` with only the wheel and its dependencies; returns its ``bin/``."""
    _run([str(python), "-m", "venv", "--without-pip", str(venv)])
    vpy = venv / "bin" / "python"
    house = wheelhouse(python, wheel)
    _pip(vpy, "install", "-q", "--no-index", "--no-compile", "--find-links", str(house), str(wheel))
    return venv / "bin"
