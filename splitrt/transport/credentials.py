"""Secret files (bearer tokens): read only when no one but their owner can read them, as ssh does for keys.

``check_private(path, what)`` raises ``ConfigError`` naming the file, its mode and the fix when group or
others have any access to it; ``read_tokens(path, what)`` checks, then returns the tokens (one per line,
blank lines and ``#`` comments ignored). Token values never appear in a message.

- ``credentials.check_private(path)`` / ``read_tokens(path)``: secret files must have no group/other bits.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from splitrt.errors import ConfigError

__all__ = ["check_private", "read_tokens"]

#: Permission bits a secret file must not have: any access for group or others (ssh's rule for keys).
OPEN_BITS = 0o077


def check_private(path: Path, what: str = "token file") -> None:
    """Refuse a secret file that group or others may read, write or execute (mode & 0o077)."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise ConfigError(f"{what} {p}: cannot read ({exc.strerror or exc})") from exc
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} {p}: expected a regular file, got {_kind(st.st_mode)}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & OPEN_BITS:
        raise ConfigError(
            f"{what} {p}: permissions {mode:04o} are too open: expected no access for group and "
            f"others (0600 or 0400), got {mode:04o}; run `chmod 600 {p}`"
        )


def read_tokens(path: Path, what: str = "token file") -> tuple[str, ...]:
    """Bearer tokens, one per line, from a private file (``check_private``); at least one."""
    p = Path(path)
    check_private(p, what)
    try:
        lines = p.read_text(encoding="utf-8-sig").splitlines()  # a BOM is not part of the first token
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ConfigError(f"{what} {p}: cannot read ({reason})") from None
    tokens = tuple(s.strip() for s in lines if s.strip() and not s.strip().startswith("#"))
    if not tokens:
        raise ConfigError(f"{what} {p}: expected at least one token, got none")
    return tokens


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    return "a special file"
