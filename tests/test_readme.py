"""The README's and the docs' commands stay true: every offline `.venv/bin/splitrt` command in a ```sh block of
README.md or docs/**/*.md runs and exits 0, the README stays a short front page, and the docs site builds
with `mkdocs build --strict` (no broken link or anchor).

Commands that need a server, root or a board (serve, run, daemon, bench, install) are exercised by
their own tests; here we run the ones a reader can paste on any machine. A command that needs a board is
written as bare `splitrt ...` so it is not run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OFFLINE_VERBS = {"zoo", "inspect", "split", "profile", "plan", "sim", "export-repository"}
README_MAX_LINES = 200


def doc_files() -> list[Path]:
    """README.md, then every page under docs/ (generated results pages included)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def docs_text() -> str:
    """README.md and every docs page, one text: what tests of documented commands and configs read."""
    return "\n".join(p.read_text() for p in doc_files())


def doc_commands() -> list[list[str]]:
    """Every `.venv/bin/splitrt ...` line of a ```sh block in README.md or docs/, offline or not."""
    return [argv for path in doc_files() for argv in sh_commands(path)]


def sh_commands(path: Path, *, every: bool = False) -> list[list[str]]:
    """The `.venv/bin/splitrt ...` lines of the page's ```sh blocks; ``every``: also `sudo .venv/bin/splitrt`
    and bare `splitrt` lines (commands for a board or root, parsed but not run), as `.venv/bin/splitrt`."""
    prefixes = (".venv/bin/splitrt ", "sudo .venv/bin/splitrt ", "splitrt ") if every else (".venv/bin/splitrt ",)
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", path.read_text(), flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" # ")[0].strip()
            if line.startswith(prefixes):
                argv = shlex.split(line.removeprefix("sudo "))
                commands.append([".venv/bin/splitrt", *argv[1:]])
    return commands


def test_readme_has_the_two_commands_first() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, flags=re.S)
    assert first_block is not None
    assert "make demo" in first_block.group(1) and "make test" in first_block.group(1)


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, at most {README_MAX_LINES}"


def test_readme_links_into_docs_exist() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#\s]+)", text)
    assert links, "the README links into docs/"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def _unique(pairs: list[tuple[Path, list[str]]]) -> list[tuple[Path, list[str]]]:
    """The first page that shows each command: the README and a guide often show the same one."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for path, argv in pairs:
        if tuple(argv) not in seen:
            seen.add(tuple(argv))
            out.append((path, argv))
    return out


COMMANDS = _unique([(p, argv) for p in doc_files() for argv in sh_commands(p) if argv[1] in OFFLINE_VERBS])


def test_docs_list_offline_commands() -> None:
    assert {argv[1] for _, argv in COMMANDS} == OFFLINE_VERBS


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [argv for _, argv in COMMANDS],
    ids=[f"{path.relative_to(ROOT)}:{' '.join(argv[1:3])}" for path, argv in COMMANDS],
)
def test_doc_command_runs(argv: list[str], tmp_path: Path) -> None:
    args = [a.replace("/tmp/", f"{tmp_path}/") for a in argv[1:]]
    if args[0] == "profile":  # keep the suite fast: the docs' profile commands, fewer runs
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


EVERY = _unique([(path, argv) for path in doc_files() for argv in sh_commands(path, every=True)])


@pytest.mark.parametrize(
    "argv", [argv for _, argv in EVERY], ids=[f"{p.relative_to(ROOT)}:{' '.join(a[1:3])}" for p, a in EVERY]
)
def test_doc_command_parses(argv: list[str]) -> None:
    """Every documented command, offline or not (serve, run, bench, daemon, rig), names real flags."""
    from splitrt.cli.app import build_parser

    try:
        args = build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse's way of saying a flag or value is wrong
        raise AssertionError(f"{' '.join(argv)}: not accepted by the parser") from exc
    assert callable(args.func)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs not installed (the docs extra)")
def test_docs_build_strict(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "site" / "cli" / "index.html").read_text().count("usage: splitrt") > 10


def test_docs_toml_blocks_are_daemon_configs(tmp_path: Path) -> None:
    """Every ```toml block of the docs is a config `splitrt daemon --check` would accept."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    from splitrt.device.daemon.config import parse_config

    blocks = [b for p in doc_files() for b in re.findall(r"```toml\n(.*?)```", p.read_text(), flags=re.S)]
    assert blocks, "the board guide shows a daemon config"
    for block in blocks:
        assert parse_config(tomllib.loads(block), base_dir=tmp_path).models, block


def test_the_cli_reference_names_every_verb() -> None:
    """docs/cli.md's table says what each verb is for; its flags are rendered from the parser."""
    from splitrt.cli.app import build_parser

    (verbs,) = [a.choices for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    table = (ROOT / "docs" / "cli.md").read_text()
    missing = [v for v in verbs if f"`{v}`" not in table]
    assert not missing, f"docs/cli.md's table lacks {missing}"
