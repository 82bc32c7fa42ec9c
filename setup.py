"""Build hook (the metadata is in pyproject.toml): the top-level ``devices/`` and ``profiles/``, the
sources the design card fixes, travel in the wheel as ``splitrt/data/devices`` and ``splitrt/data/profiles``,
where ``splitrt.paths`` finds them through importlib.resources. MANIFEST.in puts the same directories in
the sdist, so a wheel built from the sdist carries them too."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: top-level directory -> the files of it that ship
SHIPPED = {"devices": ("*.toml",), "profiles": ("*.json", "README.md")}


class BuildPyWithData(build_py):
    """build_py, then copy the shipped data into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, which has devices/ and profiles/ itself
        for name, patterns in SHIPPED.items():
            files = sorted(f for pattern in patterns for f in (ROOT / name).glob(pattern))
            if not any(f.suffix in (".toml", ".json") for f in files):
                raise SystemExit(f"setup.py: expected data files in {ROOT / name}, got none (an incomplete sdist?)")
            out = Path(self.build_lib) / "splitrt" / "data" / name
            self.mkpath(str(out))
            for f in files:
                self.copy_file(str(f), str(out / f.name))


setup(cmdclass={"build_py": BuildPyWithData})
