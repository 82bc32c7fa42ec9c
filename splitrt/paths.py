"""Where the shipped files live (board descriptors, measured profiles), with their env overrides.

Three places, first match wins: the environment variable; the checkout's top-level ``devices/`` and
``profiles/`` (the sources, when running from a checkout or an editable install); the copies a wheel
carries in ``splitrt/data/`` (``setup.py`` maps them there at build time), found through importlib.resources.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
PROFILES_ENV = "SPLITRT_PROFILES_DIR"
DEVICES_ENV = "SPLITRT_DEVICES_DIR"
_ENVS = {"devices": DEVICES_ENV, "profiles": PROFILES_ENV}


def _checkout(name: str) -> Path | None:
    # pyproject.toml beside the package: a checkout, not site-packages (where a stray top-level
    # ``devices`` package of another project could otherwise be taken for ours)
    d = REPO_DIR / name
    return d if (REPO_DIR / "pyproject.toml").is_file() and d.is_dir() else None


def _packaged(name: str) -> Path | None:
    d = resources.files("splitrt").joinpath("data").joinpath(name)
    return d if isinstance(d, Path) and d.is_dir() else None


def locate(name: str) -> tuple[Path, str]:
    """``(directory, where)`` of shipped data ``name`` (``devices`` | ``profiles``); ``where`` is
    ``$VAR`` | ``checkout`` | ``package`` | ``missing`` (then the path is the checkout's, for messages)."""
    env = os.environ.get(_ENVS[name])
    if env:
        return Path(env), f"${_ENVS[name]}"
    found = _checkout(name)
    if found is not None:
        return found, "checkout"
    found = _packaged(name)
    if found is not None:
        return found, "package"
    return REPO_DIR / name, "missing"


def profiles_dir() -> Path:
    """$SPLITRT_PROFILES_DIR, else the checkout's ``profiles/``, else the wheel's copy."""
    return locate("profiles")[0]


def devices_dir() -> Path:
    """$SPLITRT_DEVICES_DIR, else the checkout's ``devices/``, else the wheel's copy."""
    return locate("devices")[0]


def traces_dir() -> Path:
    """The shipped bandwidth traces (always inside the package)."""
    return PACKAGE_DIR / "data" / "traces"


def samples_dir() -> Path:
    """The shipped sample photographs (the zoo's default accuracy samples; always inside the package)."""
    return PACKAGE_DIR / "data" / "samples"
