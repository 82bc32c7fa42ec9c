"""The measured tables of docs/results/, generated from the benchmarks' ``--json``: never pasted by hand.

    .venv/bin/python bench/render_results.py                       # run the cheap benchmarks, write their pages
    .venv/bin/python bench/render_results.py --only solver,codec   # some of them
    .venv/bin/python bench/render_results.py --from-json F --bench NAME   # render a run you made (the slow ones)
    .venv/bin/python bench/render_results.py --index               # only rewrite docs/results/index.md

Each page (``docs/results/<name>.md``) starts with when and where it was measured: the date (UTC), the commit
(marked when tracked files had uncommitted changes), the command, how long it took, the host (CPUs,
Python, onnxruntime) and the host's load average before and after the run (the machine is shared: read
every figure beside it). The raw JSON is kept beside the page (``<name>.json``), and ``index.md`` lists
every benchmark: the cheap ones with their page, the slow ones (root, the rig, tens of minutes) with the
command that produces theirs. ``make results`` runs this script with no argument.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import progress

from splitrt.rig import regret

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results"
Table = tuple[str, list[str], list[list[Any]]]  # (heading, header, rows)


@dataclass(frozen=True, kw_only=True)
class Bench:
    name: str  # the script is bench/bench_<name>.py unless ``script`` names another
    title: str
    what: str  # one paragraph: what it measures and where the docs discuss it
    args: tuple[str, ...] = ()  # the arguments of the run `make results` makes (cheap) or documents (slow)
    json_to_stdout: bool = True  # `--json` prints; False: `--json FILE` (FILE '-' is stdout)
    cheap: bool = True
    how: str = ""  # slow ones: the command that produces the JSON to render
    skip: tuple[str, ...] = field(default_factory=tuple)  # top-level JSON keys too large for a page
    script: str = ""  # from the checkout's top: the adversarial suites live in attacks/, not bench/

    @property
    def path(self) -> str:
        return self.script or f"bench/bench_{self.name}.py"

    def command(self) -> list[str]:
        json_args = ["--json"] if self.json_to_stdout else ["--json", "-"]
        return [sys.executable, self.path, *self.args, *json_args]


def fmt(v: Any) -> str:
    """A cell: floats to 3-4 significant figures, containers as compact JSON (cut at 80 characters)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        a = abs(v)
        if a >= 100:
            return f"{v:.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.3f}"  # ratios to the best, the oracle or fp32 live here
        return f"{v:.3g}"
    if isinstance(v, (dict, list, tuple)):
        s = json.dumps(v, separators=(",", ":"), default=str)
        v = s if len(s) <= 80 else s[:77] + "..."
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(fmt(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def records_table(heading: str, records: list[dict[str, Any]]) -> Table:
    """A list of JSON objects as one table; the columns are every key, in first-seen order."""
    header: list[str] = []
    for r in records:
        header += [k for k in r if k not in header]
    return heading, header, [[r.get(k, "") for k in header] for r in records]


def is_load(key: str) -> bool:
    return "load" in key.lower() and key.lower() not in ("loads",)


def json_loads(doc: Any) -> str:
    """The load averages a benchmark recorded in its own JSON (top level), as one line."""
    if not isinstance(doc, dict):
        return ""
    return "; ".join(f"{k} {fmt_load(v)}" for k, v in doc.items() if is_load(k) and not isinstance(v, dict))


def generic(obj: Any, heading: str = "", skip: tuple[str, ...] = ()) -> list[Table]:
    """Tables for any benchmark's JSON: lists of objects become tables, scalars a key/value table."""
    if isinstance(obj, list) and obj and all(isinstance(r, dict) for r in obj):
        return [records_table(heading, obj)]
    if not isinstance(obj, dict):
        return [(heading, ["value"], [[obj]])] if obj is not None else []
    skip = (*skip, *(k for k in obj if is_load(k)))  # the page's header shows them
    scalars = [[k, v] for k, v in obj.items() if k not in skip and not isinstance(v, (dict, list))]
    scalars += [
        [k, v]
        for k, v in obj.items()
        if k not in skip and isinstance(v, list) and not any(isinstance(x, dict) for x in v)
    ]
    out: list[Table] = [(heading, ["", "value"], scalars)] if scalars else []
    for k, v in obj.items():
        if k in skip or not isinstance(v, (dict, list)) or (isinstance(v, list) and not v):
            continue
        if isinstance(v, list) and not all(isinstance(x, dict) for x in v):
            continue
        out += generic(v, f"{heading} {k}".strip(), skip)
    return out


def grid_tables(doc: dict[str, Any]) -> list[Table]:
    """bench_sim / bench_rig_grid: the regret summary (splitrt.rig.regret), split vs route, then every cell."""
    cells = doc["cells"]
    labelled = [(f"{c['trace']} {c['model']} x{c['bandwidth_scale']:g} {c['load']}", c["strategies"]) for c in cells]
    out: list[Table] = [
        ("regret: each strategy against the per-cell best", regret.HEADER, regret.rows(regret.regret(labelled)))
    ]
    if any("route" in c["strategies"] for c in cells):
        sr = [regret.split_route(labelled, "adaptive"), regret.split_route(labelled, "oracle")]
        out.append(("split vs route", regret.SPLIT_ROUTE_HEADER, regret.split_route_rows(sr)))
    rows = []
    for (label, strategies), c in zip(labelled, cells, strict=True):
        a, o = strategies["adaptive"], strategies["oracle"]
        rows.append([label, a["mean_ms"], o["mean_ms"], a["p95_ms"], o["p95_ms"], c.get("mean_vs_best", "")])
    out.append(
        (
            "cells",
            ["cell", "adaptive mean ms", "oracle mean ms", "adaptive p95 ms", "oracle p95 ms", "mean / best other"],
            rows,
        )
    )
    scalars = [[k, v] for k, v in doc.items() if k != "cells" and not isinstance(v, (dict, list))]
    if scalars:
        out.insert(0, ("settings", ["", "value"], scalars))
    return out


def rig_grid_tables(doc: dict[str, Any]) -> list[Table]:
    """bench_rig_grid: adaptive against the best router per cell (issue 34), the wins, then every
    strategy's mean per cell."""
    r = doc.get("routers") or {}
    cells = doc["cells"]
    settings = [[k, doc[k]] for k in ("board", "duration_s", "turn_s", "rate_hz") if k in doc]
    out: list[Table] = [("settings", ["", "value"], settings)] if settings else []
    if r:
        out.append(
            (
                "adaptive against the best router (the lower mean of route and route-codec)",
                [
                    "cell",
                    "best router",
                    "adaptive ms",
                    "router ms",
                    "adaptive / router",
                    "95 % CI",
                    "call",
                    "split-half",
                    "adaptive's plans",
                    "router's plans",
                ],
                [
                    [
                        c["cell"],
                        c["best_router"],
                        c["adaptive_ms"],
                        c["router_ms"],
                        c["ratio"],
                        "{:.3f}-{:.3f}".format(*c["ci"]),
                        c["call"],
                        c["ratio_split_half"],
                        c["adaptive_plans"],
                        c["router_plans"],
                    ]
                    for c in r["cells"]
                ],
            )
        )
        out.append(
            (
                "over the grid",
                ["", "value"],
                [
                    ["cells", len(r["cells"])],
                    ["geometric mean of adaptive / best router (target <= 1.00)", r["geomean"]],
                    ["the same, the router chosen on the other half of the turns", r["geomean_split_half"]],
                    *(
                        [["the same expected with no difference (requests relabelled within turns)", r["geomean_null"]]]
                        if "geomean_null" in r
                        else []
                    ),
                    ["cells better / same / worse (95 % CI over turns)", f"{r['better']} / {r['same']} / {r['worse']}"],
                ],
            )
        )
        for name, key, what in (
            ("adaptive-hold", "hold", "the controller before held gains added up"),
            ("adaptive-keep", "keep", "the link estimate before a lone slow sample was dropped"),
            ("adaptive-news", "news", "the link estimate before a lone slow sample waited to be confirmed"),
        ):
            ablated = [c for c in r["cells"] if f"{key}_ratio" in c]
            if not ablated:
                continue
            out.append(
                (
                    f"adaptive against {name} ({what}), in the same run",
                    ["cell", "adaptive / router", "95 % CI", f"{name} / router", "95 % CI", f"{name}'s plans"],
                    [
                        [
                            c["cell"],
                            c["ratio"],
                            "{:.3f}-{:.3f}".format(*c["ci"]),
                            c[f"{key}_ratio"],
                            "{:.3f}-{:.3f}".format(*c[f"{key}_ci"]),
                            c[f"{key}_plans"],
                        ]
                        for c in ablated
                    ]
                    + [["geometric mean", r["geomean"], "", r.get(f"geomean_{key}", ""), "", ""]],
                )
            )
        out.append(
            (
                "cells where adaptive beats the best router by >= 10 %",
                ["cell", "adaptive / router", "router", "adaptive's plans", "router's plans", "why"],
                [
                    [c["cell"], c["ratio"], c["best_router"], c["adaptive_plans"], c["router_plans"], c["why"]]
                    for c in r["wins"]
                ]
                or [["none", "", "", "", "", ""]],
            )
        )
    per: dict[str, list[dict[str, float]]] = {}
    for c in cells:
        for plan, f in c.get("prediction", {}).items():
            per.setdefault(plan, []).append(f)
    if any("floor" in f for fs in per.values() for f in fs):  # runs before the floor (issue 34) lack it
        out.append(
            (
                "prediction per cell: the error beside its noise floor (median |m - median(m)| / m, the best "
                "constant prediction in hindsight) and the bias median(measured) / median(predicted)",
                ["cell", "adaptive's plan", "requests", "median |m-p|/m", "floor", "measured / predicted"],
                [
                    [f"{c['trace']} {c['model']} x{c['scale']:g} {c['load']}", plan]
                    + [f.get(k) for k in ("n", "median_err", "floor", "ratio")]
                    for c in cells
                    for plan, f in c.get("prediction", {}).items()
                ],
            )
        )
    if per:
        out.append(
            (
                "prediction: adaptive's plans, median |measured - predicted| / measured per cell",
                ["plan", "cells", "requests", "median over the cells", "worst cell"],
                [
                    [
                        plan,
                        len(fs),
                        sum(int(f["n"]) for f in fs),
                        statistics.median(f["median_err"] for f in fs),
                        max(f["median_err"] for f in fs),
                    ]
                    for plan, fs in sorted(per.items(), key=lambda kv: -sum(f["n"] for f in kv[1]))
                ],
            )
        )
    names = list(dict.fromkeys(n for c in cells for n in c.get("strategies", {})))
    out.append(
        (
            "mean latency per strategy (ms)",
            ["cell", *names, "load average"],
            [
                [f"{c['trace']} {c['model']} x{c['scale']:g} {c['load']}"]
                + [c["strategies"].get(n, {}).get("mean_ms") for n in names]
                + [fmt_load(c.get("load_average", "-"))]
                for c in cells
                if "strategies" in c
            ],
        )
    )
    return out


def route_tables(doc: dict[str, Any]) -> list[Table]:
    """bench_route: route/split per model (and over all), for adaptive and the oracle; then the extra tables."""
    rows = []
    for model, by in doc["summary"].items():
        sr = [regret.SplitRoute(**{**v, "geo_ci": tuple(v["geo_ci"])}) for v in by.values()]
        rows += [[model, *r] for r in regret.split_route_rows(sr)]
    out: list[Table] = [
        ("route/split per model (> 1: splitting is faster)", ["model", *regret.SPLIT_ROUTE_HEADER], rows)
    ]
    for key in ("privacy", "pays"):
        if doc.get(key):
            out.append(records_table(key, doc[key]))
    settings = [[k, v] for k, v in doc.items() if not isinstance(v, (dict, list, tuple)) and not is_load(k)]
    return [("settings", ["", "value"], settings), *out] if settings else out


def warm_tables(doc: dict[str, Any]) -> list[Table]:
    """bench_warm: per request delay and variant, the first request's time, median (range) over the runs."""

    def mr(xs: list[float]) -> str:
        return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})" if xs else "-"

    rows = [
        [f"{key.split('/')[0]} s after listening", key.split("/")[1], mr(v["ms"]), mr(v["build_ms"]), mr(v["warm_ms"])]
        for key, v in doc["variants"].items()
    ]
    header = ["request sent", "server", "first request ms", "of which waiting for its tail", "warm-up done after"]
    settings = [[k, v] for k, v in doc.items() if k != "variants" and not is_load(k)]
    return [("settings", ["", "value"], settings), ("the first request after a restart", header, rows)]


def solver_tables(doc: dict[str, Any]) -> list[Table]:
    return [
        records_table("re-plan time with the profile loaded", doc["timings"]),
        ("min-cut agreement", ["", "value"], [[k, v] for k, v in doc["agreement"].items()]),
    ]


def accuracy_tables(doc: dict[str, Any]) -> list[Table]:
    """bench_accuracy: per model, codecs x cuts, each cell the bytes sent (x fp32) and the agreement."""
    out: list[Table] = []
    for r in doc["results"]:
        by = {(x["cut"], x["codec"]): x for x in r["rows"]}
        codecs = list(dict.fromkeys(x["codec"] for x in r["rows"]))
        header = ["codec", *(f"{c} ({by[c, 'fp32']['bytes']} B)" for c in r["cuts"])]
        rows = []
        for k in codecs:
            cells = []
            for c in r["cuts"]:
                x = by[c, k]
                lo, hi = x["agreement_ci95"]
                ci = f" [{lo:.2f}, {hi:.2f}]" if lo < hi else ""
                cells.append(f"{x['x_fp32']:.4f}x, {x['agreement']:.3f}{ci}")
            rows.append([k, *cells])
        heading = (
            f"{r['model']}: {r['metric']} agreement over {r['photos']} photographs, at cloud and "
            f"{len(r['cuts']) - 1} of {r['cuts_total']} cuts (bytes x fp32, agreement [95 % CI])"
        )
        out.append((heading, header, rows))
    return out


BENCHES: list[Bench] = [
    Bench(
        name="solver",
        title="Solver speed",
        what="How long one re-plan takes with a profile loaded (two and three tiers, per objective, the sweep), "
        "and whether the DADS min-cut agrees with exhaustive enumeration. See [Plans](../concepts/plans.md).",
    ),
    Bench(
        name="controller",
        title="Controller overhead and flapping",
        what="The controller's cost per request (estimate update and re-plan) on densenet121's cuts, how many "
        "requests it needs to follow a 20x drop of bandwidth across its slowest plan boundary (the estimate's "
        "share, then the controller's own), and how often it switches under +-20 % noise. "
        "See [the controller](../concepts/controller.md).",
    ),
    Bench(
        name="graph",
        title="Cuts and segments",
        what="Cut enumeration and splitting speed, and cuts' head-then-tail outputs against the whole model "
        "(`--quick`: about 12 cuts per model; five models, free dims included; the whole zoo: drop `--models`). "
        "See [Cuts and bindings](../concepts/cuts.md).",
        args=("--quick", "--models", "squeezenet,resnet50,densenet121,bert_tiny,yolo_tiny"),
    ),
    Bench(
        name="codec",
        title="Codecs",
        what="Per zoo model, evenly spread cuts x random inputs: the bytes each codec sends against fp32 (median "
        "and smallest over the cuts, and what the shipped profile prices), top-1 agreement with the fp32 split, "
        "the largest relative error, and encode + decode time. See [Codecs](../concepts/codecs.md).",
        skip=("per_cut",),
    ),
    Bench(
        name="sim",
        title="Regret over the held-out grid, simulated",
        what="The rig's acceptance grid replayed through the decision logic (`splitrt.rig.sim`) on the held-out "
        "HSDPA traces: each strategy's worst cell and geometric mean against the per-cell best. See the "
        "[rig guide](../rig.md#what-adaptation-buys-regret-over-a-grid).",
        args=("--traces", "heldout", "--duration", "120"),
        json_to_stdout=False,
    ),
    Bench(
        name="route",
        title="Split vs route, simulated",
        what="8 models x the held-out traces x bandwidth x load: route/split of the mean latency (> 1: splitting "
        "is faster), per model, with 95 % bootstrap intervals. See [Split or route](../concepts/split-vs-route.md).",
        json_to_stdout=False,
        skip=("cells",),
    ),
    Bench(
        name="router_sweep",
        title="Where adaptive beats the best router, simulated",
        what="Every shipped profile's model on a Raspberry Pi 4 x the 8 HSDPA traces x bandwidth x0.5-x5 x "
        "device load (none, a burst, a busy board) x two prices of the device's encode (the board's compute "
        "factor, as `splitrt sim`; 2x the host's, as the rig's CPU quota charges it): adaptive / min(route, "
        "route-codec), and each cell >= 10 % either way with both plans' terms. See the "
        "[rig guide](../rig.md#what-adaptation-buys-regret-over-a-grid).",
        cheap=False,
        how=".venv/bin/python bench/bench_router_sweep.py --json router_sweep.json   # about 6 min",
        skip=("cells",),
    ),
    Bench(
        name="rig_grid",
        title="Adaptive against the best router, on the kernel rig",
        what="Adaptive against the best whole-request router on real processes, a kernel-shaped link and a "
        "throttled device: the shipped HSDPA traces x (resnet50, inception_v1 at bandwidth x1 with load none "
        "and device-burst; squeezenet at x1 and x5 on a busy board, device-busy); the ablations (adaptive-hold, "
        "adaptive-keep) when run beside it. See the "
        "[rig guide](../rig.md#what-adaptation-buys-regret-over-a-grid).",
        cheap=False,
        how="sudo .venv/bin/python bench/bench_rig_grid.py --strategies "
        "adaptive,route,route-codec,oracle --json grid.json   # root, about 30 min",
    ),
    Bench(
        name="tiers",
        title="Three tiers on the rig",
        what="Device -> edge -> cloud against every static alternative, latency and estimated energy. See the "
        "[rig guide](../rig.md#three-tiers-in-the-rig).",
        cheap=False,
        how="sudo .venv/bin/python bench/bench_tiers.py --objective energy --json tiers.json   # root, about 12 min",
    ),
    Bench(
        name="fleet",
        title="A fleet, one server killed",
        what="24 emulated devices against 2 servers, the second killed in every segment. See the "
        "[rig guide](../rig.md#fleets-many-devices-servers-killed).",
        cheap=False,
        how="sudo .venv/bin/python bench/bench_fleet.py --codecs all --json fleet.json   # root, about 8 min",
    ),
    Bench(
        name="attack",
        title="Hostile and careless clients",
        what="Every attack class against its own server, with a legit client beside it. See "
        "[Security](../operator/security.md).",
        cheap=False,
        how=".venv/bin/python attacks/bench_attack.py --json > attack.json   # about 20 min; --quick: 2 min",
        script="attacks/bench_attack.py",
    ),
    Bench(
        name="transport",
        title="Transport overhead and server throughput",
        what="A split request's overhead over raw gRPC per payload size, and the server's throughput with "
        "8 devices; with `--b-pythonpath OLD` (another tree: `git archive 545808c | tar -x -C OLD`) a second "
        "server runs that tree's splitrt, its requests and throughput rounds alternating with this one's "
        "(`b_*` columns; `a_minus_b_ms`: median of paired differences, 95 % CI). See "
        "[The server](../operator/server.md).",
        cheap=False,
        how=".venv/bin/python bench/bench_transport.py --b-pythonpath OLD --json > transport.json   # a few minutes",
    ),
    Bench(
        name="warm",
        title="Warm start",
        what="The first request after a restart, with and without the warm-up. See "
        "[The server](../operator/server.md#warm-start).",
        cheap=False,
        how=".venv/bin/python bench/bench_warm.py --json > warm.json   # about a minute, restarts servers",
    ),
    Bench(
        name="profiler",
        title="Profile accuracy",
        what="The profile's per-cut prediction against fresh direct sessions. See "
        "[Cost model and profiles](../concepts/costmodel.md).",
        cheap=False,
        how=".venv/bin/python bench/bench_profiler.py --json > profiler.json   # tens of minutes; needs a quiet host",
    ),
    Bench(
        name="badinput",
        title="Bad input and the model store",
        what="Random and mutated messages and malformed models against a server. See "
        "[Security](../operator/security.md).",
        cheap=False,
        how=".venv/bin/python attacks/bench_badinput.py --json > badinput.json   # several minutes",
        script="attacks/bench_badinput.py",
    ),
]
BENCHES += [
    Bench(
        name="imagelib",
        title="Image codec libraries",
        what="Pillow, simplejpeg and OpenCV encoding and decoding a photograph and a tiled feature map as "
        "JPEG and WebP (the libraries missing here are skipped). See [Codecs](../concepts/codecs.md).",
    ),
    Bench(
        name="board_emulation",
        title="What the emulated board adds to a remote call",
        what="A 64 B gRPC echo's round trip from a process under the rig's CPU quota, with 0, 1 and 3 "
        "busy-loops beside it (the rig's loads) either under the same quota (loops) or aside with the quota "
        "shrunk to the caller's share (share, the rig's since 83fa3a8), against the same call unthrottled. "
        "See the [rig guide](../rig.md) and the [known limits](../known-limits.md).",
        cheap=False,
        how="sudo .venv/bin/python bench/bench_board_emulation.py --json board_emulation.json   # root, ~1 min",
    ),
    Bench(
        name="accuracy",
        title="Codecs and the model's output on real photographs",
        what="Bytes sent and output agreement of every codec at the input and at spread cuts of real-weights "
        "image models on 63 real photographs. See [Codecs](../concepts/codecs.md).",
        cheap=False,
        how=".venv/bin/python bench/bench_accuracy.py --json > accuracy.json   # ~25 min; fetches photos once",
    ),
]


def _attack_load(r: dict[str, Any]) -> str:
    loads = r.get("load_1m_blocks")  # interleaved blocks (since 2026-12-06 13:30 UTC): lowest-highest
    if loads:
        return f"{min(loads):.1f}-{max(loads):.1f}"
    return f"{r['load_1m']:.1f}" if "load_1m" in r else "-"


def attack_tables(doc: dict[str, Any]) -> list[Table]:
    """bench_attack: one line per row (the load as it began; p99 ratio with its 95 % CI; the verdict)."""
    rows = []
    for r in doc["rows"]:
        ratio = r["attack_p99_ms"] / r["base_p99_ms"] if r["attack_p99_ms"] and r["base_p99_ms"] else None
        ci = r.get("p99_x_ci95") or []
        fails = [name for name, ok in r["targets"] if not ok]
        verdict = "PASS" if r["pass"] else "FAIL: " + ", ".join(fails)
        if not r["pass"] and r.get("proxy_row"):
            verdict += f" (the edge proxy's job: {r['proxy_row']})"
        rows.append(
            [
                r["row"],
                r["attack"],
                _attack_load(r),
                "-" if ratio is None else f"{ratio:.1f}" + (f" ({ci[0]:.1f}-{ci[1]:.1f})" if ci else ""),
                f"{r['legit_failed']}/{r['legit_calls']}",
                f"{r['lost_deadline']}/{r['lost_no_deadline']}",
                f"{r['peak_rss_mb']:.0f}/{r['budget_mb']:g}",
                "-" if r["sigterm_exit_s"] is None else f"{r['sigterm_exit_s']:.1f}",
                verdict,
            ]
        )
    header = ["row", "attack", "load", "p99 x (95 % CI)", "legit failed", "lost", "peak RSS/budget MiB", "SIGTERM s"]
    return [("", [*header, "verdict"], rows)]


RENDERERS: dict[str, Callable[[dict[str, Any]], list[Table]]] = {
    "attack": attack_tables,
    "accuracy": accuracy_tables,
    "solver": solver_tables,
    "route": route_tables,
    "warm": warm_tables,
    "sim": grid_tables,
    "rig_grid": rig_grid_tables,
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()


def commit() -> str:
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    # Changes to text (the docs, markdown) or to this renderer do not change what a benchmark measures.
    text = (":!docs", ":!*.md", ":!mkdocs.yml", ":!bench/render_results.py")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", *text)
    return f"{head} (with uncommitted changes to the code)" if dirty else head


def host() -> str:
    try:
        import onnxruntime

        ort = f", onnxruntime {onnxruntime.__version__}"
    except ImportError:  # pragma: no cover - a dependency
        ort = ""
    return f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, Python {platform.python_version()}{ort}"


def fmt_load(v: Any) -> str:
    """A load average as the JSON holds it (one number, or the 1/5/15-minute triple) as 1.23/4.56/7.89."""
    if isinstance(v, (list, tuple)):
        return "/".join(fmt_load(x) for x in v)
    return f"{v:.2f}" if isinstance(v, (int, float)) else str(v)


def loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def page(b: Bench, doc: Any, meta: list[list[str]]) -> str:
    try:
        tables = RENDERERS.get(b.name, lambda d: generic(d, skip=b.skip))(doc)
    except (KeyError, TypeError, ValueError) as exc:  # a JSON of another shape (an older run): show it all
        progress("results", f"bench_{b.name}: {type(exc).__name__} {exc}: rendering the JSON as it is")
        tables = generic(doc, skip=b.skip)
    parts = [
        f"# {b.title}",
        "",
        f"Generated by `bench/render_results.py` from `{b.path} --json`: do not edit by hand.",
        "",
        md_table(["measured", ""], meta),
        "",
        b.what,
        "",
        "This host is a shared 2-core machine: other work ran beside the benchmark, so timings are read beside "
        "the load average above and compared only within one run.",
    ]
    for heading, header, rows in tables:
        parts += ["", f"## {heading}", "", md_table(header, rows)] if heading else ["", md_table(header, rows)]
    return "\n".join(parts) + "\n"


def run(b: Bench) -> tuple[Any, list[list[str]]]:
    cmd = b.command()
    before, t0 = loadavg(), time.monotonic()
    progress("results", f"{' '.join(cmd[1:])} (load average {before})")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_{b.name} exited {proc.returncode}: {proc.stderr[-2000:]}")
    took = time.monotonic() - t0
    shown = " ".join([".venv/bin/python", *cmd[1:]])
    meta = [
        ["date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")],
        ["commit", commit()],
        ["command", f"`{shown}`"],
        ["took", f"{took:.0f} s"],
        ["host", host()],
        ["load average (1/5/15 min)", f"before {before}, after {loadavg()}"],
    ]
    doc = json.loads(proc.stdout)
    if json_loads(doc):
        meta.append(["load average, as the benchmark read it", json_loads(doc)])
    return doc, meta


def from_json(b: Bench, path: Path) -> tuple[Any, list[list[str]]]:
    doc = json.loads(path.read_text())
    mtime = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
    when = (
        f"{doc['started']} (start of the run)"
        if "started" in doc
        else f"{mtime:%Y-%m-%d %H:%M} UTC (the JSON file's time)"
    )
    ran = f"{doc['commit']} (the run's)" if "commit" in doc else "the run's own commit is not recorded in its JSON"
    meta = [
        ["date", when],
        ["commit", f"{ran}; rendered at {commit()}"],
        ["command", f"`{b.how.split('#')[0].strip()}`" if b.how else f"`{b.path} --json`"],
        ["host", host()],
        ["load average", json_loads(doc) or "not recorded in the JSON"],
    ]
    return doc, meta


def scrub(text: str) -> str:
    """This checkout's and this user's paths out of a page: they name the machine (tests/test_tree.py)."""
    return text.replace(f"{ROOT}/", "").replace(str(ROOT), ".").replace(str(Path.home()), "~")


def write(b: Bench, doc: Any, meta: list[list[str]]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{b.name}.json").write_text(scrub(json.dumps(doc, indent=1, default=str)) + "\n")
    (OUT / f"{b.name}.md").write_text(scrub(page(b, doc, meta)))
    progress("results", f"wrote docs/results/{b.name}.md")


def stub(b: Bench) -> str:
    """The page of a slow benchmark nobody has rendered yet: what it measures and how to produce it."""
    command = b.how.split("#")[0].strip()
    json_file = command.split()[-1]
    return (
        f"# {b.title}\n\nNot measured yet (its cost: {b.how.split('#')[-1].strip()}): `make results` runs only "
        "the cheap benchmarks.\n\n"
        f"{b.what}\n\nTo produce this page, run it and render its JSON:\n\n```text\n{command}\n"
        f".venv/bin/python bench/render_results.py --from-json {json_file} --bench {b.name}\n```\n"
    )


def index() -> None:
    rows = []
    for b in BENCHES:
        if not b.cheap and not (OUT / f"{b.name}.md").exists():
            (OUT / f"{b.name}.md").write_text(stub(b))
        name = f"[{b.title}]({b.name}.md)" if (OUT / f"{b.name}.md").exists() else b.title
        how = "`make results`" if b.cheap else f"`{b.how.split('#')[0].strip()}`, then `--from-json`"
        rows.append([name, f"`{b.path}`", how])
    text = (
        "# Results\n\n"
        "Measured tables are generated from the benchmarks' `--json`, never pasted by hand: `make results` runs the "
        "cheap benchmarks and `bench/render_results.py` writes one page per benchmark here, headed with the date, "
        "the commit, the command and the host's load average (a shared 2-core machine: read every figure beside "
        "its load average). The raw JSON sits beside each page.\n\n"
        "The slow benchmarks need root (the rig) or tens of minutes; run the command in the table, then render "
        "its JSON:\n\n"
        "```text\n.venv/bin/python bench/render_results.py --from-json grid.json --bench rig_grid\n```\n\n"
        "A cheap benchmark without a link has not been run yet; a slow one's page says how to produce it.\n\n"
        + md_table(["benchmark", "script", "how to produce it"], rows)
        + "\n\nThe guides state the conclusions these tables support: the [rig guide](../rig.md), "
        "[Security](../operator/security.md), [Codecs](../concepts/codecs.md), "
        "[Split or route](../concepts/split-vs-route.md).\n"
    )
    (OUT / "index.md").write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated benchmark names (default: every cheap one)")
    ap.add_argument("--from-json", type=Path, metavar="FILE", help="render this JSON instead of running")
    ap.add_argument("--bench", default="", help="with --from-json: which benchmark made it")
    ap.add_argument("--index", action="store_true", help="only rewrite docs/results/index.md")
    args = ap.parse_args()
    by_name = {b.name: b for b in BENCHES}
    if args.from_json:
        if args.bench not in by_name:
            ap.error(f"--bench: expected one of {', '.join(by_name)}, got {args.bench!r}")
        write(by_name[args.bench], *from_json(by_name[args.bench], args.from_json))
    elif not args.index:
        names = args.only.split(",") if args.only else [b.name for b in BENCHES if b.cheap]
        unknown = [n for n in names if n not in by_name]
        if unknown:
            ap.error(f"--only: unknown {unknown}; expected names from {', '.join(by_name)}")
        for n in names:
            write(by_name[n], *run(by_name[n]))
    index()
    return 0


if __name__ == "__main__":
    sys.exit(main())
