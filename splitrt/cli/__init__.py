"""``splitrt <verb>``: argument parsing and table/JSON rendering only; the work is in the packages."""

from __future__ import annotations

from splitrt.cli.app import main

__all__ = ["main"]
