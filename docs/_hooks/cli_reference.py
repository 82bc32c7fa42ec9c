"""mkdocs hook: the CLI reference (docs/cli.md) is `splitrt <verb> --help` of the installed parser, rendered at
build time where the page says ``<!-- splitrt-cli -->``, so it cannot drift from the code."""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- splitrt-cli -->"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse has no public way to list sub-parsers
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _sections(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
    out = []
    for name, sub in _subcommands(parser):
        path = f"{prefix} {name}"
        out.append(f"### `{path}`\n\n```text\n{sub.format_help().rstrip()}\n```\n")
        out.extend(_sections(sub, path))
    return out


def render() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fix it for a stable page
    from splitrt.cli.app import build_parser

    return "\n".join(_sections(build_parser(), "splitrt"))


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
