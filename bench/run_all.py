"""Run every benchmark in bench/ with its defaults and print each table (`make bench`).

    python bench/run_all.py [--only graph,solver,...]

Takes a while (the rig benchmarks need root and minutes). Each script also runs on its own, with
`--json` for machines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated names, e.g. graph,solver (bench_<name>.py)")
    args = ap.parse_args()
    scripts = sorted(p for p in HERE.glob("bench_*.py"))
    if args.only:
        wanted = {f"bench_{n}.py" for n in args.only.split(",")}
        scripts = [s for s in scripts if s.name in wanted]
    failed = []
    for script in scripts:
        print(f"\n## {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script)], check=False).returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
