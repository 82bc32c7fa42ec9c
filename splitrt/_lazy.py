"""Lazy re-exports for the packages' ``__init__``: importing a package stays cheap (no grpc or
onnxruntime until a name that needs them is used) and cannot create an import circle."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def exports(
    package: str, names: Mapping[str, str], *, legacy: str | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` that resolve ``name`` from module ``names[name]``
    (relative to the package). A module itself is exported by mapping its name to ``""``. ``legacy``:
    the module that held this package's name in splitrt 0.1 (``splitrt.rig`` was ``rig/harness.py``);
    its public names keep resolving."""

    def __getattr__(name: str) -> Any:
        where = names.get(name)
        if where is None and not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
            where = ""  # a submodule (``from package import mod`` asks here before importing it)
        if where is None and legacy is not None and not name.startswith("_"):
            where = legacy
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if where == "":
            return importlib.import_module(f"{package}.{name}")
        return getattr(importlib.import_module(f"{package}.{where}"), name)

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
