"""The flat module names of splitrt <= 0.1 (``splitrt.costmodel``, ``splitrt.rigbench``, ...) keep
importing: each is an alias of the module in its package, with a ``DeprecationWarning`` naming the new
path. ``splitrt.graph``, ``.device``, ``.cloud``, ``.rig`` and ``.cli`` are packages now and re-export
their old public names themselves."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    "partition": "graph.partition", "zoo": "graph.zoo",
    "costmodel": "plan.costmodel", "solver": "plan.solver", "mincut": "plan.mincut",
    "controller": "plan.controller", "netmon": "plan.netmon",
    "profiler": "profile.profiler", "priors": "profile.priors", "boards": "profile.boards",
    "codec": "transport.codec", "wire": "transport.wire", "splitrt_pb2": "transport.splitrt_pb2",
    "splitrt_pb2_grpc": "transport.splitrt_pb2_grpc", "protogen": "transport.protogen",
    "discovery": "transport.discovery",
    "runtime": "device.runtime", "run_stream": "cli.stream", "daemon": "device.daemon", "finder": "device.finder",
    "netns": "rig.netns", "cgroup": "rig.cgroup", "shaper": "rig.shaper", "traces": "rig.traces",
    "rigbench": "rig.bench", "rigworker": "rig.worker", "rigstats": "rig.stats", "sim": "rig.sim",
    "cmd_bench": "cli.bench", "cmd_daemon": "cli.daemon", "cmd_demo": "cli.demo", "cmd_model": "cli.model",
    "cmd_plan": "cli.plan", "cmd_run": "cli.run", "cmd_serve": "cli.serve", "cmd_sim": "cli.sim",
    "tables": "cli.tables",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.target}", DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the target module is already executed


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        head, _, tail = fullname.partition(".")
        if head != "splitrt" or tail not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(f"splitrt.{MOVED[tail]}"))


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
