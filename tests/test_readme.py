"""The README's commands stay true: every offline `.venv/bin/splitrt` command in it runs and exits 0.

Commands that need a server, root or a board (serve, run, daemon, bench, install) are exercised by
their own tests; here we run the ones a reader can paste on any machine.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OFFLINE_VERBS = {"zoo", "inspect", "split", "profile", "plan", "sim", "export-repository"}


def readme_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" # ")[0].strip()
            if line.startswith(".venv/bin/splitrt "):
                commands.append(shlex.split(line))
    return commands


def test_readme_has_the_two_commands_first() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, flags=re.S)
    assert first_block is not None
    assert "make demo" in first_block.group(1) and "make test" in first_block.group(1)


COMMANDS = [c for c in readme_commands() if c[1] in OFFLINE_VERBS]


def test_readme_lists_offline_commands() -> None:
    assert {c[1] for c in COMMANDS} == OFFLINE_VERBS


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c[1:3]) for c in COMMANDS])
def test_readme_command_runs(argv: list[str], tmp_path: Path) -> None:
    args = [a.replace("/tmp/", f"{tmp_path}/") for a in argv[1:]]
    if args[0] == "profile":  # keep the suite fast: the README's profile command, fewer runs
        args += ["--runs", "2", "--warmup", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "splitrt.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
    if "--out" in args:  # profile, split and export-repository write files
        out = Path(args[args.index("--out") + 1])
        assert out.exists() and (out.is_file() or any(out.iterdir()))
    else:
        assert proc.stdout.strip(), "a table or JSON on stdout"
