"""HACKING.md names only what exists: every ``splitrt/...py`` and ``tests/...py`` path, and every
``splitrt.x.y`` module (or name in a module) it mentions. Contracts live in the modules' docstrings, so a
module that is renamed or deleted must not leave HACKING.md pointing at it."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = (REPO / "HACKING.md").read_text()


def _resolves(dotted: str) -> bool:
    """``splitrt.a.b.c``: the longest prefix that is a module, the rest attributes of it."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        module = ".".join(parts[:k])
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            continue
        obj: object = importlib.import_module(module)
        for name in parts[k:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_path_hacking_names_exists() -> None:
    paths = sorted(set(re.findall(r"(?<![\w./-])((?:splitrt|tests)/[\w/.-]*?\.py)\b", TEXT)))
    assert paths, "HACKING.md names no splitrt/ or tests/ file: the pattern is wrong"
    missing = [p for p in paths if not (REPO / p).is_file()]
    assert not missing, f"HACKING.md names files that do not exist: {missing}"


def test_every_module_hacking_names_exists() -> None:
    names = sorted(set(re.findall(r"\bsplitrt(?:\.\w+)+", TEXT)))
    assert names, "HACKING.md names no splitrt.x module: the pattern is wrong"
    missing = [n for n in names if not _resolves(n)]
    assert not missing, f"HACKING.md names modules or names that do not exist: {missing}"


def test_the_check_fails_on_a_missing_module() -> None:
    assert _resolves("splitrt.graph.model.load") and _resolves("splitrt.graph.cuts")
    assert not _resolves("splitrt.graph.no_such_module") and not _resolves("splitrt.graph.model.no_such_name")
