"""Profile accuracy and cost: the profiler's head/tail times vs fresh direct head/tail sessions.

For every cut of each model (or every ``--every``-th), a fresh head session and a fresh tail session
are timed (median of ``--runs``) and compared with the profile's prediction. Every 5th cut is measured
directly twice: the "noise" columns are how far two direct measurements of the same head or tail are
apart, the floor any profile can reach here. Prints a table per model (median and p90 relative error,
profiling time) or ``--json``. Progress on stderr.

Models with free dims (bert_tiny, vit_tiny, yolo_tiny) are profiled and checked at ``zoo.default_binding``.
Timings are only as good as the host is quiet: the 1-minute load average is read before and after each
model (column ``load1 b>a``, JSON ``load1_before``/``load1_after``); the target (median segment error
<= 10 %, p90 <= 30 %) is meant for a load average below 1.

    .venv/bin/python bench/bench_profiler.py [--models resnet50,inception_v1,squeezenet] [--json]

``--cli-before REV``: instead, how long the whole ``splitrt profile MODEL`` command takes (segments, codecs and
the accuracy guard on the zoo's photographs), the code at git revision REV against this tree's (or
``--cli-after REV``'s), run alternately (``--cli-rounds`` each, each a fresh process on the same venv) with
the load average before and after every run: wall and CPU seconds (user + system: the steadier on a shared
host), their means with 95 % bootstrap intervals, and the ratios after / before with theirs.

    .venv/bin/python bench/bench_profiler.py --cli-before main --models squeezenet [--cli-rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from splitrt.graph import model as graph
from splitrt.graph import zoo
from splitrt.profile import profiler


def bench_model(name: str, *, runs: int, threads: int | None, segments: int, every: int) -> dict[str, object]:
    path = zoo.get(name)
    load1_before = os.getloadavg()[0]
    # The profile and the direct checks at the same shapes: the zoo's binding for a model with free dims.
    binding = zoo.default_binding(path)
    g = graph.load(path, binding)
    t0 = time.perf_counter()
    prof = profiler.measure(
        path, runs=runs, threads=threads, segments=segments, progress=lambda m: None, binding=binding
    )
    profiling_s = time.perf_counter() - t0
    feeds = zoo.random_inputs(path, binding=binding)
    rows = []
    inner = [c for c in prof.cuts if c.cut not in ("cloud", "device")]
    noise: list[float] = []
    for n, c in enumerate(inner[::every]):
        head, tail = profiler.measure_direct(g, c.cut, feeds, runs=runs, threads=threads)
        if n % 5 == 0:  # the noise floor: the same direct measurement, repeated
            head2, tail2 = profiler.measure_direct(g, c.cut, feeds, runs=runs, threads=threads)
            noise += [abs(head2 - head) / head, abs(tail2 - tail) / tail]
        rows.append(
            {
                "cut": c.cut,
                "pred_head_ms": c.head_ms,
                "direct_head_ms": head,
                "pred_tail_ms": c.tail_ms,
                "direct_tail_ms": tail,
                "head_err": abs(c.head_ms - head) / head,
                "tail_err": abs(c.tail_ms - tail) / tail,
            }
        )
        if n % 10 == 0:
            print(f"[bench] {name}: {n + 1}/{len(inner[::every])} cuts checked", file=sys.stderr, flush=True)
    errs = np.array([r["head_err"] for r in rows] + [r["tail_err"] for r in rows])
    heads = np.array([r["head_err"] for r in rows])
    tails = np.array([r["tail_err"] for r in rows])
    return {
        "model": name,
        "input_shapes": {k: list(v) for k, v in (g.input_shapes or {}).items()},
        "load1_before": load1_before,
        "load1_after": os.getloadavg()[0],
        "cuts": len(prof.cuts),
        "checked": len(rows),
        "segments": prof.runtime["segments"],
        "threads": prof.runtime["intra_op_threads"],
        "profiling_s": round(profiling_s, 2),
        "total_ms": prof.total_ms,
        "whole_model_ms": prof.runtime.get("whole_model_ms"),
        "anchors": prof.runtime.get("anchors"),
        "run_overhead_ms": prof.runtime.get("run_overhead_ms"),
        "median_err": float(np.median(errs)),
        "p90_err": float(np.percentile(errs, 90)),
        "head_median_err": float(np.median(heads)),
        "head_p90_err": float(np.percentile(heads, 90)),
        "tail_median_err": float(np.median(tails)),
        "tail_p90_err": float(np.percentile(tails, 90)),
        "noise_median": float(np.median(noise)) if noise else None,
        "noise_p90": float(np.percentile(noise, 90)) if noise else None,
        "rows": rows,
    }


def _timed_cli(model: str, tree: str, out: str) -> dict[str, float]:
    import resource

    load1 = os.getloadavg()[0]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "splitrt.cli", "profile", model, "--out", out],
        env={**os.environ, "PYTHONPATH": tree},
        cwd=tree,  # ``-m`` puts the working directory first on sys.path: it must be the tree timed
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    return {"s": round(wall, 2), "cpu_s": round(cpu, 2), "load1_before": load1, "load1_after": os.getloadavg()[0]}


def bench_cli(model: str, *, before_rev: str, after_rev: str | None, rounds: int) -> dict[str, Any]:
    """``splitrt profile MODEL`` at ``before_rev`` (extracted with ``git archive``) and at ``after_rev``
    (None: this tree), alternately; ``PYTHONPATH`` picks the code, the venv is this one."""
    from splitrt.rig.regret import bootstrap_ratio
    from splitrt.rig.report import bootstrap_ci

    root = Path(__file__).resolve().parents[1]

    def short(rev: str) -> str:
        got = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", rev], capture_output=True, text=True)
        return got.stdout.strip() or rev

    with tempfile.TemporaryDirectory(prefix="splitrt-before-") as tmp:
        trees = {"before": f"{tmp}/before", "after": f"{tmp}/after" if after_rev else str(root)}
        for label, rev in (("before", before_rev), ("after", after_rev)):
            if rev:
                os.makedirs(trees[label])
                subprocess.run(f"git -C '{root}' archive {rev} | tar -x -C '{trees[label]}'", shell=True, check=True)
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
        for r in range(rounds):
            for label in ("before", "after") if r % 2 == 0 else ("after", "before"):
                runs[label].append(_timed_cli(model, trees[label], f"{tmp}/{label}.json"))
                print(f"[bench] {model} {label} round {r + 1}: {runs[label][-1]}", file=sys.stderr, flush=True)
    loads = [x[k] for v in runs.values() for x in v for k in ("load1_before", "load1_after")]
    out: dict[str, Any] = {
        "model": model,
        "before_rev": short(before_rev),
        "after_rev": short(after_rev) if after_rev else "this tree",
        "rounds": rounds,
        "runs": runs,
        "load1_min": min(loads),
        "load1_max": max(loads),
    }
    for what in ("s", "cpu_s"):  # wall and CPU (user + system) seconds: CPU is the steadier on a shared host
        xs = {k: [x[what] for x in v] for k, v in runs.items()}
        for k, v in xs.items():
            out[f"{k}_mean_{what}"] = float(np.mean(v))
            out[f"{k}_ci_{what}"] = list(bootstrap_ci([[x] for x in v]))
        out[f"ratio_{what}"] = float(np.mean(xs["after"]) / np.mean(xs["before"]))
        out[f"ratio_ci_{what}"] = list(bootstrap_ratio([[x] for x in xs["after"]], [[x] for x in xs["before"]]))
    return out


def print_cli_table(r: dict[str, Any]) -> None:
    print(
        f"`splitrt profile {r['model']}`, {r['rounds']} alternating runs each (load1 over the runs "
        f"{r['load1_min']:.1f}-{r['load1_max']:.1f}: a shared 2-core host)"
    )
    print(f"{'code':<24}{'wall s':>8}{'95 % CI':>14}{'CPU s':>8}{'95 % CI':>14}   runs (wall s)")
    for k in ("before", "after"):
        cells = ""
        for what in ("s", "cpu_s"):
            lo, hi = r[f"{k}_ci_{what}"]
            cells += f"{r[f'{k}_mean_{what}']:>8.1f}{f'{lo:.1f}-{hi:.1f}':>14}"
        each = ", ".join(f"{x['s']:.0f}" for x in r["runs"][k])
        label = f"{k} ({r[k + '_rev']})"
        print(f"{label:<24}{cells}   {each}")
    cells = ""
    for what in ("s", "cpu_s"):
        lo, hi = r[f"ratio_ci_{what}"]
        cells += f"{r[f'ratio_{what}']:>8.2f}{f'{lo:.2f}-{hi:.2f}':>14}"
    print(f"{'after / before':<24}{cells}")


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        f"{'model':<14}{'cuts':>6}{'seg':>5}{'thr':>5}{'prof s':>8}{'total ms':>10}"
        f"{'head med':>10}{'head p90':>10}{'tail med':>10}{'tail p90':>10}{'all med':>9}{'all p90':>9}"
        f"{'noise med':>10}{'noise p90':>10}{'load1 b>a':>12}"
    )
    for r in results:
        print(
            f"{r['model']:<14}{r['checked']:>6}{r['segments']:>5}{r['threads']:>5}{r['profiling_s']:>8.1f}"
            f"{r['total_ms']:>10.2f}{r['head_median_err']:>10.1%}{r['head_p90_err']:>10.1%}"
            f"{r['tail_median_err']:>10.1%}{r['tail_p90_err']:>10.1%}{r['median_err']:>9.1%}{r['p90_err']:>9.1%}"
            f"{r['noise_median'] or 0:>10.1%}{r['noise_p90'] or 0:>10.1%}"
            f"{r['load1_before']:>7.2f}>{r['load1_after']:<4.2f}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,inception_v1,squeezenet")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--segments", type=int, default=16)
    ap.add_argument("--every", type=int, default=1, help="check every N-th cut (1 = all)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cli-before", default=None, metavar="REV", help="time the profile command at REV vs here")
    ap.add_argument("--cli-after", default=None, metavar="REV", help="with --cli-before: REV, not this tree")
    ap.add_argument("--cli-rounds", type=int, default=3)
    args = ap.parse_args()
    if args.cli_before:
        revs = {"before_rev": args.cli_before, "after_rev": args.cli_after}
        cli = [bench_cli(m, **revs, rounds=args.cli_rounds) for m in args.models.split(",")]
        if args.json:
            print(json.dumps(cli, indent=1))
        for r in cli if not args.json else ():
            print_cli_table(r)
        return 0
    results = [
        bench_model(m, runs=args.runs, threads=args.threads, segments=args.segments, every=args.every)
        for m in args.models.split(",")
    ]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
