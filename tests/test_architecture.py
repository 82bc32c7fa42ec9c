"""The package map in HACKING.md holds in the code: imports point down the layers, no module imports
itself back through others (no circles), the decision core stays pure, units stay small, no block of
code is written twice, and the public names users import are all still there."""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "splitrt"

# What each package may import (besides itself, the root package, errors, paths and _lazy).
# Must match the table in HACKING.md (test_hacking_map_matches_the_rules checks it).
ALLOWED: dict[str, set[str]] = {
    "graph": set(),
    "plan": set(),
    "transport": set(),
    "profile": {"graph", "plan", "transport"},
    "cloud": {"graph", "plan", "profile", "transport"},
    "device": {"graph", "plan", "profile", "transport"},
    "export": {"graph", "transport"},
    "rig": {"graph", "plan", "profile", "transport", "cloud", "device"},
    "cli": {"graph", "plan", "profile", "transport", "cloud", "device", "export", "rig"},
}
BASE = {"errors", "paths", "_lazy", "_signals", "_gc", ""}
# Libraries the pure core must not touch: sockets, sessions, processes, clocks, files.
IMPURE = {
    "socket",
    "grpc",
    "onnxruntime",
    "onnx",
    "subprocess",
    "threading",
    "time",
    "os",
    "pathlib",
    "psutil",
    "zeroconf",
    "io",
    "random",
    "asyncio",
    "concurrent",
    "logging",
    "datetime",
    "shutil",
}
# Sizes count statements, not physical lines: `ruff format` wraps a long call over many lines without making
# the unit any harder to read, and a blank line is free.
MAX_FUNCTION_STATEMENTS = 100
MAX_MODULE_STATEMENTS = 400


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (REPO / rel).with_suffix(".py").exists() or (REPO / rel / "__init__.py").exists()


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _lazy_map(package: str) -> tuple[dict[str, str], str | None]:
    """A package ``__init__``'s lazy re-exports (``_lazy.exports(__name__, {name: module}, legacy=)``): each
    name -> the module that holds it (a module re-exported as itself maps to its own name), and the
    legacy module (names not in the map resolve there). Empty for a module or an eager ``__init__``."""
    init = REPO / Path(*package.split(".")) / "__init__.py"
    if not init.exists():
        return {}, None
    tree = ast.parse(init.read_text())
    dicts = {
        t.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "exports" and len(node.args) >= 2:
            table = node.args[1]
            table = dicts.get(table.id, table) if isinstance(table, ast.Name) else table
            names = {
                k.value: f"{package}.{v.value or k.value}"
                for k, v in zip(getattr(table, "keys", []), getattr(table, "values", []), strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
            legacy = next((kw.value.value for kw in node.keywords if kw.arg == "legacy"), None)
            return names, f"{package}.{legacy}" if legacy else None
    return {}, None


def _resolve(package: str, name: str) -> str:
    """What ``from package import name`` imports: the submodule ``name``, else the module a lazy
    ``__init__`` resolves ``name`` from, else the package itself."""
    sub = f"{package}.{name}"
    if _is_module(sub):
        return sub
    names, legacy = _lazy_map(package)
    return names.get(name) or legacy or package


def imports(path: Path, *, runtime_only: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in the file, local imports and ``TYPE_CHECKING`` ones
    included (``runtime_only``: without those). ``from splitrt.pkg import Name`` is an import of the module
    ``splitrt/pkg/__init__.py``'s lazy map resolves ``Name`` from (only that module is imported)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if node.lineno in skip if hasattr(node, "lineno") else False:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                yield node.lineno, _resolve(node.module, a.name)


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for name, path in modules():
        pkg = _package(name)
        if pkg not in ALLOWED:
            continue
        for line, target in imports(path):
            if not target.startswith("splitrt"):
                continue
            tpkg = _package(target)
            if tpkg != pkg and tpkg not in BASE and tpkg not in ALLOWED[pkg]:
                wrong.append(
                    f"{path.relative_to(REPO)}:{line} imports {target} ({pkg} may import "
                    f"{sorted(ALLOWED[pkg]) or 'nothing'} besides errors/paths)"
                )
    assert not wrong, "\n".join(wrong)


def test_base_modules_import_no_package() -> None:
    for base in ("errors", "paths", "_lazy", "_signals", "_gc"):
        targets = [t for _, t in imports(PKG / f"{base}.py") if t.startswith("splitrt")]
        assert targets == [], f"splitrt/{base}.py imports {targets}: it sits below every package"


def import_graph() -> dict[str, set[str]]:
    """Module -> the splitrt modules it imports, ``TYPE_CHECKING`` imports included (mypy follows them, and
    a reader must too; a type-only circle is a circle of concepts). A package's ``__init__`` imports
    the modules its lazy map names (``_lazy.exports``: each resolves on first use), so it sits above
    them; importing a submodule is no import of its package (Python runs the package's ``__init__``
    first, but a lazy one imports nothing then), and ``from splitrt.pkg import Name`` imports only the
    module the map names for ``Name`` (``imports``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules():
        targets = {t for _, t in imports(path)}
        targets |= set(_lazy_map(name)[0].values())
        graph[name] = {t for t in targets if t.startswith("splitrt.") and t != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


# Circles left to break, each listed whole; the test fails when one changes or goes, so the list only shrinks.
CIRCLES_LEFT: list[list[str]] = []


def test_no_import_circles() -> None:
    circles = import_circles(import_graph())
    new = [c for c in circles if c not in CIRCLES_LEFT]
    assert not new, "import circles (TYPE_CHECKING imports count):\n" + "\n".join(map(str, new))
    gone = [c for c in CIRCLES_LEFT if c not in circles]
    assert not gone, f"circles broken or changed: update CIRCLES_LEFT: {gone}"


def test_the_circle_finder_sees_type_checking_imports() -> None:
    graph = import_graph()
    # splitrt.device's __init__ names its runtime lazily, and imports it under TYPE_CHECKING.
    assert "splitrt.device.runtime" in graph["splitrt.device"]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Inside splitrt.cloud, its concepts point down too: what each part of the server may import of the others
# (its sub-package or top-level module). The handler runs on capacity, models and the guard, never the
# other way round; the lifecycle (server) wires them all.
CLOUD_PARTS: dict[str, set[str]] = {
    "common": set(),
    "capacity": {"common"},
    "models": {"common", "capacity"},
    "guard": {"common", "capacity"},
    "config": {"common", "capacity", "models", "guard"},
    "metrics": {"common", "capacity", "models", "guard"},
    "handler": {"common", "capacity", "models", "guard", "config", "metrics"},
    "advertise": {"common", "guard"},
    "server": {"common", "capacity", "models", "guard", "config", "metrics", "handler"},
}


def test_cloud_parts_point_down() -> None:
    def part(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[:2] == ["splitrt", "cloud"] else None

    wrong = []
    for name, path in modules():
        here = part(name)
        if here is None:
            continue
        assert here in CLOUD_PARTS, f"splitrt.cloud.{here} is in no row of CLOUD_PARTS: say what it may import"
        for line, target in imports(path):  # TYPE_CHECKING imports included
            there = part(target)
            if there is not None and there != here and there not in CLOUD_PARTS[here]:
                rule = sorted(CLOUD_PARTS[here])
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {target} (cloud.{here} may import {rule})")
    assert not wrong, "\n".join(wrong)


def test_the_decision_core_is_pure() -> None:
    wrong = []
    for name, path in modules():
        if _package(name) != "plan":
            continue
        for line, target in imports(path):
            if target.split(".")[0] in IMPURE:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {target}")
        text = path.read_text()
        for pat in (r"\bopen\(", r"\bmonotonic\(", r"\bperf_counter\(", r"\bsleep\("):
            for m in re.finditer(pat, text):
                wrong.append(f"{path.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1} calls {m.group(0)}")
    assert not wrong, "the plan package must stay pure (pass now_s and measurements in):\n" + "\n".join(wrong)


def _statements(node: ast.AST) -> int:
    return len({s.lineno for s in ast.walk(node) if isinstance(s, ast.stmt)})


def test_no_unit_over_the_size_limits() -> None:
    long = []
    for _, path in modules():
        if "pb2" in path.name:
            continue
        tree = ast.parse(path.read_text())
        if _statements(tree) > MAX_MODULE_STATEMENTS:
            long.append(f"{path.relative_to(REPO)}: {_statements(tree)} statements")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            size = _statements(node)
            if size > MAX_FUNCTION_STATEMENTS:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} def {node.name}: {size} statements")
    assert not long, "\n".join(long)


MAX_MODULE_LINES = 600
# A block of this many significant lines standing twice is one piece of code written twice.
DUPLICATE_LINES = 6
# Lines that say nothing alone: blank, comments, imports, a bracket or colon on its own.
_INSIGNIFICANT = re.compile(r"$|#|import |from \S+ import |[()\[\]{}:,]+$")


def test_no_module_over_600_lines() -> None:
    long = []
    for _, path in modules():
        n = len(path.read_text().splitlines())
        if "pb2" not in path.name and n > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(REPO)}: {n} lines (at most {MAX_MODULE_LINES})")
    assert not long, "\n".join(long)


def significant_lines(text: str) -> list[tuple[int, str]]:
    """(line number, the line with its whitespace folded) for every line that says something alone."""
    folded = ((no, " ".join(raw.split())) for no, raw in enumerate(text.splitlines(), 1))
    return [(no, line) for no, line in folded if not _INSIGNIFICANT.match(line)]


def duplicated_blocks(files: dict[str, str], size: int = DUPLICATE_LINES) -> list[list[tuple[str, int]]]:
    """Each run of ``size`` consecutive significant lines standing more than once in ``files`` (name ->
    text), within a file or across files: the places (name, first line) where it stands. Overlapping
    windows of one longer block are reported once, at the block's first window."""
    places: dict[tuple[str, ...], list[tuple[str, int, int]]] = {}  # (file, window index, first line)
    for name, text in files.items():
        lines = significant_lines(text)
        for i in range(len(lines) - size + 1):
            key = tuple(line for _, line in lines[i : i + size])
            places.setdefault(key, []).append((name, i, lines[i][0]))
    found: list[list[tuple[str, int]]] = []
    last: set[tuple[str, int]] = set()
    for where in places.values():
        if len(where) < 2:
            continue
        if not any((name, i - 1) in last for name, i, _ in where):  # not the next window of the block before
            found.append([(name, line) for name, _, line in where])
        last = {(name, i) for name, i, _ in where}
    return found


def test_the_duplicate_finder_finds_a_block_and_skips_what_says_nothing() -> None:
    block = "".join(f"x{i} = f(y, {i})\n" for i in range(7))
    noise = "\n# a comment\nimport os\n)\n"
    spread = noise.join(block.splitlines(keepends=True))  # the same seven lines, noise between them
    found = duplicated_blocks({"a.py": "def a():\n" + block, "b.py": spread})
    assert [sorted(w) for w in found] == [[("a.py", 2), ("b.py", 1)]]
    assert not duplicated_blocks({"a.py": block, "b.py": block.replace("x3", "z3")})


def test_no_block_of_six_lines_stands_twice() -> None:
    files = {str(path.relative_to(REPO)): path.read_text() for _, path in modules() if "_pb2" not in path.name}
    found = duplicated_blocks(files)
    text = [" and ".join(f"{name}:{line}" for name, line in where) for where in found]
    assert not found, (
        f"{len(found)} blocks of {DUPLICATE_LINES}+ lines stand twice (one piece of code should serve):\n"
        + "\n".join(text)
    )


# -- one request's path through the modules ---------------------------------------------------------
#
# How many times one request enters each module, from ``AdaptiveDevice.infer`` through the cloud's tail run
# and back (#35: "enters each module at most twice"). A *visit* is a maximal run of consecutive frames of one
# thread's stack in the same file of splitrt/ (frames outside splitrt/: stdlib, numpy, grpc, the methods
# dataclasses generate, are transparent); each visit is an entry into its module from another module (or
# from outside splitrt: the test, grpc's threads). A return is no entry: a function that calls four
# modules in turn is read once, top to bottom. A visit that enters no other module is a lookup (a value's
# method, a pure helper: ``CostTable.index``, ``Codec.parse``) and is not counted: the path a reader
# follows is the tree of visits that lead on.
PATH_MAX_ENTRIES = 2
# The server's and runtime's own loops, on their own threads: not the request's path.
BACKGROUND_THREADS = (
    "splitrt-watchdog",
    "splitrt-canceller",
    "splitrt-advertise",
    "splitrt-upload-pace",
    "splitrt-warm-write",
    "splitrt-prober",
)


@dataclass
class _Visit:
    module: str
    function: str
    caller: str  # the module it was entered from ("": from outside splitrt)
    onward: int = 0  # the visits it made into other modules


def trace_entries(run: Callable[[], object]) -> list[_Visit]:
    """Every visit (see above) the process makes while ``run()`` runs, on any thread but the background
    loops. Threads started before the call are seen only when ``threading.setprofile`` was set before
    they started: the caller sets it (``trace_entries`` sets ``sys.setprofile`` for its own thread)."""
    root = str(PKG) + os.sep
    visits: list[_Visit] = []
    visit_of: dict[int, _Visit] = {}

    def module(code: Any) -> str | None:
        f = code.co_filename
        return f[len(root) :] if f.startswith(root) else None

    def profile(frame: Any, event: str, arg: object) -> None:
        if event not in ("call", "return"):
            return
        m = module(frame.f_code)
        if m is None:
            return
        if event == "return":
            visit_of.pop(id(frame), None)
            return
        if threading.current_thread().name.startswith(BACKGROUND_THREADS):
            return
        caller = frame.f_back
        while caller is not None and id(caller) not in visit_of:
            caller = caller.f_back
        parent = visit_of[id(caller)] if caller is not None else None
        if parent is not None and parent.module == m:
            visit_of[id(frame)] = parent
            return
        visit = _Visit(module=m, function=frame.f_code.co_name, caller=parent.module if parent else "")
        if parent is not None:
            parent.onward += 1
        visits.append(visit)
        visit_of[id(frame)] = visit

    _TRACING["profile"] = profile
    sys.setprofile(_profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        _TRACING.clear()
    return visits


_TRACING: dict[str, Callable[[Any, str, object], None]] = {}


def _profile(frame: Any, event: str, arg: object) -> None:
    """The profile function every thread gets (``threading.setprofile``): a no-op unless tracing."""
    profile = _TRACING.get("profile")
    if profile is not None:
        profile(frame, event, arg)


def path_entries(visits: list[_Visit]) -> dict[str, int]:
    """Module -> the visits that led on (the path's entries into it)."""
    counts: dict[str, int] = {}
    for v in visits:
        if v.onward:
            counts[v.module] = counts.get(v.module, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _wide_chain(path: Path) -> None:
    """Conv-Relu-Conv-Relu with seeded random weights, answering 32x32x32 float32 (128 KiB): a reply over
    ``REPLY_COUNTED_BYTES``, which the server holds in its memory budget until the call ends."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w1 = rng.normal(0, 0.3, (32, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.1, (32, 32, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a1"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a1"], ["r1"]),
            helper.make_node("Conv", ["r1", "w2"], ["a2"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a2"], ["y"]),
        ],
        "wide_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 32, 32])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)


@pytest.mark.parametrize("name", ["tiny_chain", "wide_chain"])
def test_one_request_enters_each_module_at_most_twice(tmp_path: Path, name: str) -> None:
    """A real ``AdaptiveDevice`` and a real ``CloudServer`` on 127.0.0.1 (one process: both sides traced), a
    model split at a middle cut: ``tiny_chain`` (a small reply) and ``wide_chain`` (a 128 KiB reply, held in
    the server's memory budget until the call ends). The second request is the path; the first also
    builds (the cloud loads the model and its tail; the device its sessions, and asks the cloud's Status
    first): it is held to the same limit."""
    from splitrt.cloud.capacity.memory import REPLY_COUNTED_BYTES
    from splitrt.cloud.server import CloudServer, ServerConfig
    from splitrt.device.client.config import DeviceConfig
    from splitrt.device.runtime import AdaptiveDevice, RuntimeConfig
    from splitrt.graph import model, zoo
    from splitrt.profile.priors import flops_table

    if name == "tiny_chain":
        shutil.copyfile(zoo.get("tiny_chain"), tmp_path / "tiny_chain.onnx")
    else:
        _wide_chain(tmp_path / f"{name}.onnx")
    mg = model.load(tmp_path / f"{name}.onnx")
    cuts = [c.id for c in mg.cuts()]
    cut = cuts[len(cuts) // 2]
    outcomes: list[Any] = []
    threading.setprofile(_profile)  # the server's threads, started below
    try:
        with CloudServer(ServerConfig(models_dir=tmp_path, workers=1, intra_op_threads=1)) as server:
            dev = AdaptiveDevice(
                mg,
                flops_table(mg, device_gflops=5, cloud_gflops=100),
                [server.address],
                config=RuntimeConfig(policy=f"fixed:{cut}", deadline_ms=60_000),  # a loaded host's cold build
                device_config=DeviceConfig(intra_op_threads=1),
                start_prober=False,
            )
            with dev:
                x = dev.local.random_inputs(seed=1)

                def request() -> None:
                    outcomes.append(dev.infer(x))
                    # The call's end (gRPC's callback, after the client has the reply) is on the path too:
                    # its lease gives the reply's bytes back, then the lane. Read as an attribute, so the
                    # wait enters no module.
                    for _ in range(1000):
                        if server.door.inside["infer"] == 0:
                            break
                        threading.Event().wait(0.01)
                    ended.append(server.door.inside["infer"] == 0)

                ended: list[bool] = []
                first, visits = (trace_entries(request) for _ in range(2))
            held = server.door.snapshot()["reply_bytes"]
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    assert [(o.server, o.plan.split("@")[0]) for o in outcomes] == [(server.address, cut)] * 2
    reply_bytes = sum(a.nbytes for a in outcomes[-1].outputs.values())
    assert (reply_bytes >= REPLY_COUNTED_BYTES) == (name == "wide_chain"), reply_bytes
    assert ended == [True, True] and held == 0  # the calls left their lane and gave their replies' bytes back
    entries = path_entries(visits)
    assert "cloud/handler/infer.py" in entries, entries
    over = {m: n for m, n in entries.items() if n > PATH_MAX_ENTRIES}
    cold = {m: n for m, n in path_entries(first).items() if n > PATH_MAX_ENTRIES}
    how = [
        f"{v.caller or '-'} -> {v.module}:{v.function}"
        for v in [*first, *visits]
        if v.onward and v.module in {**over, **cold}
    ]
    assert not over and not cold, (
        f"modules one request enters more than {PATH_MAX_ENTRIES} times: {over}, the first: {cold} (all: {entries})\n"
        + "\n".join(how)
    )


# A module name that encodes a tier count or a topology variant is a twin waiting to happen (#24): one
# plan, controller, runtime and server request path serve any path of tiers. `rig` still has its
# three-tier bench modules (tier*.py, to become topologies of the one rig): listed until they go.
TOPOLOGY_NAME = re.compile(r"(two|three|[0-9])_?tiers?|chain|edge|relay|^tiers?|fleet")
TOPOLOGY_PACKAGES = ("splitrt.plan", "splitrt.device", "splitrt.cloud", "splitrt.rig")
TOPOLOGY_NAMES_LEFT: set[str] = set()  # the rig's were the last (#24: one rig)


def test_no_module_name_encodes_a_topology() -> None:
    bad = [
        name
        for name, _ in modules()
        if name.startswith(TOPOLOGY_PACKAGES)
        and TOPOLOGY_NAME.search(name.rsplit(".", 1)[-1])
        and name not in TOPOLOGY_NAMES_LEFT
    ]
    assert not bad, f"module names that encode a tier count or topology: {bad}"
    gone = sorted(n for n in TOPOLOGY_NAMES_LEFT if not _is_module(n))
    assert not gone, f"renamed or deleted: drop them from TOPOLOGY_NAMES_LEFT: {gone}"


def test_hacking_map_matches_the_rules() -> None:
    text = (REPO / "HACKING.md").read_text()
    rows = dict(re.findall(r"^\| `splitrt\.(\w+)` \|[^|]*\| ([^|]*) \|$", text, flags=re.M))
    assert set(rows) == set(ALLOWED), f"HACKING.md's package map lists {sorted(rows)}, code has {sorted(ALLOWED)}"
    for pkg, cell in rows.items():
        named = set(re.findall(r"`(\w+)`", cell))
        assert named == ALLOWED[pkg], (
            f"HACKING.md says {pkg} may import {sorted(named)}; the rule is {sorted(ALLOWED[pkg])}"
        )


# The names users import (README, HACKING contracts). Removing one is an
# API change: update this list only with a deprecation path.
PUBLIC = {
    "splitrt": ["Device", "SplitrtError", "__version__"],
    "splitrt.errors": [
        "SplitrtError",
        "ModelError",
        "CutError",
        "PlanError",
        "ProfileError",
        "CodecError",
        "CloudError",
        "InputError",
        "ConfigError",
        "RigError",
        "DiscoveryError",
    ],
    "splitrt.graph": [
        "load",
        "ModelGraph",
        "TensorInfo",
        "Cut",
        "model_sha256",
        "split",
        "head_tail",
        "Segment",
        "SegmentCache",
        "zoo",
    ],
    "splitrt.plan": [
        "CostTable",
        "Conditions",
        "Link",
        "Power",
        "solve",
        "evaluate",
        "parse_plan",
        "Plan",
        "solve_path",
        "Controller",
        "ControllerConfig",
        "Decision",
        "Policy",
        "parse_policy",
        "replay",
        "LinkEstimator",
        "LinkEstimate",
        "LoadEstimator",
        "LoadEstimate",
    ],
    "splitrt.profile": [
        "measure",
        "save_profile",
        "load_profile",
        "cost_table",
        "Profile",
        "flops_table",
        "load_board",
        "Board",
    ],
    "splitrt.transport": ["Codec", "encode", "decode", "Encoded"],
    "splitrt.cloud": ["CloudServer", "ServerConfig", "tokens_from_file"],
    "splitrt.device": [
        "Device",
        "DeviceConfig",
        "SplitResult",
        "HeadResult",
        "read_token",
        "AdaptiveDevice",
        "RuntimeConfig",
        "Outcome",
        "Daemon",
        "LocalClient",
        "load_config",
    ],
    "splitrt.rig": ["Rig", "RigConfig", "BenchConfig", "run_bench"],
    "splitrt.cli": ["main"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_importable(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [n for n in PUBLIC[module] if not hasattr(mod, n)]
    assert not missing, f"{module} lost public names {missing}"
