"""Where the checkout's shipped files live (``profiles/``, ``devices/``), with their env overrides."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
PROFILES_ENV = "SPLITRT_PROFILES_DIR"
DEVICES_ENV = "SPLITRT_DEVICES_DIR"


def profiles_dir() -> Path:
    """$SPLITRT_PROFILES_DIR, else the checkout's ``profiles/``."""
    env = os.environ.get(PROFILES_ENV)
    return Path(env) if env else REPO_DIR / "profiles"


def devices_dir() -> Path:
    """$SPLITRT_DEVICES_DIR, else the checkout's ``devices/``."""
    env = os.environ.get(DEVICES_ENV)
    return Path(env) if env else REPO_DIR / "devices"
