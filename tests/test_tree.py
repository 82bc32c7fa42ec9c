"""The checkout stands on its own: nothing tracked points outside it, and a copy of the tracked files is
what the wheel is built from (``tests/wheelcheck.copy_tracked``), so a fresh clone behaves as CI does."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests import wheelcheck

# Absolute paths of the machines the project was built on; a tracked file naming one works only there.
BUILD_MACHINE_PATH = re.compile(rb"(?<![\w.])/(?:work|root|home/[a-z_][\w-]*)/")


def test_no_tracked_symlink_leaves_the_checkout() -> None:
    root = wheelcheck.REPO.resolve()
    leaving = []
    for name in wheelcheck.tracked_files():
        path = wheelcheck.REPO / name
        if path.is_symlink():
            target = (path.parent / os.readlink(path)).resolve()
            if root not in target.parents and target != root:
                leaving.append(f"{name} -> {os.readlink(path)}")
    assert leaving == [], f"tracked symlinks pointing outside the checkout: {leaving}"


def test_no_tracked_file_names_a_build_machine_path() -> None:
    found = []
    for name in wheelcheck.tracked_files():
        path = wheelcheck.REPO / name
        if path.is_symlink() or not path.is_file():
            continue
        for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
            if BUILD_MACHINE_PATH.search(line):
                found.append(f"{name}:{lineno}")
    assert found == [], f"absolute paths of a build machine in tracked files: {found[:20]}"


def test_the_build_copy_holds_tracked_files_only(tmp_path: Path) -> None:
    stray = wheelcheck.REPO / "splitrt" / "_untracked_stray_for_test.py"
    stray.write_text("raise SystemExit('an untracked file reached the build')\n")
    try:
        wheelcheck.copy_tracked(tmp_path)
    finally:
        stray.unlink()
    copied = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink()}
    tracked = {n for n in wheelcheck.tracked_files() if (wheelcheck.REPO / n).exists()}
    assert copied == tracked
    assert "splitrt/_untracked_stray_for_test.py" not in copied
    assert "pyproject.toml" in copied and "proto/splitrt.proto" in copied
