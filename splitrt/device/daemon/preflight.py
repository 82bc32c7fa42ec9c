"""What the daemon's config names on this machine, checked before anything starts (``splitrt daemon
--check`` and the start itself): a config that passes here does not fail at start on a path.

- ``preflight(config)``: ``ConfigError`` naming the key, the expected and the actual value for
  ``api_socket_path`` (a socket path of at most 107 bytes in a directory on a real filesystem; an existing
  file there must be a socket: the start removes it), ``decision_log_path`` (a regular file on a real
  filesystem, or none yet), ``board`` (a board name or a ``.toml`` path that loads) and each model's path
  (``zoo:NAME`` or a regular file: ``/dev/zero`` would be read for ever).

Real filesystem: not ``/proc``, ``/sys``, ``/dev`` and the like (``PSEUDO_FS``), judged by the mount the
path (or its nearest existing parent) is on.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from splitrt.errors import ConfigError

__all__ = ["PSEUDO_FS", "preflight"]

PSEUDO_FS = frozenset(
    [
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "cgroup",
        "cgroup2",
        "debugfs",
        "securityfs",
        "tracefs",
        "configfs",
        "bpf",
        "pstore",
        "efivarfs",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "binfmt_misc",
        "autofs",
        "nsfs",
    ]
)
# sockaddr_un's sun_path is 108 bytes on Linux, with the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


def _mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type), longest mount point first; empty where /proc/self/mounts is not."""
    try:
        text = Path("/proc/self/mounts").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out.append((parts[1].replace("\\040", " "), parts[2]))
    return sorted(out, key=lambda m: len(m[0]), reverse=True)


def _existing(path: Path) -> Path:
    """``path`` resolved, or its nearest existing ancestor's."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p.resolve()


def _fs_type(path: Path) -> str | None:
    where = str(_existing(path))
    for point, fs in _mounts():
        if where == point or where.startswith(point.rstrip("/") + "/"):
            return fs
    return None


def _on_real_fs(key: str, path: Path, expected: str) -> None:
    fs = _fs_type(path)
    if fs in PSEUDO_FS:
        raise ConfigError(f"key {key!r}: expected {expected} on a real filesystem, got {str(path)!r} on {fs}")
    anchor = _existing(path.parent)
    if not anchor.is_dir():
        raise ConfigError(f"key {key!r}: expected {expected} in a directory, got {str(path)!r} under a file {anchor}")


def _stat_on_real_fs(key: str, path: Path, expected: str, *, follow: bool) -> os.stat_result | None:
    """``path``'s stat (a link's own unless ``follow``) once its directory is on a real filesystem; None:
    nothing there yet (the start makes it)."""
    _on_real_fs(key, path, expected)
    try:
        return path.stat() if follow else path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"key {key!r}: expected {expected}, got {str(path)!r} unreadable ({exc.strerror})") from exc


def _check_socket(path: Path) -> None:
    key, expected = "api_socket_path", "a unix socket path"
    if len(os.fsencode(str(path))) > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(
            f"key {key!r}: expected {expected} of at most {MAX_SOCKET_PATH_BYTES} bytes, got "
            f"{len(os.fsencode(str(path)))} bytes"
        )
    st = _stat_on_real_fs(key, path, expected, follow=False)
    if st is not None and not stat.S_ISSOCK(st.st_mode):  # the start removes what is there: only an old socket may be
        raise ConfigError(f"key {key!r}: expected {expected} (or nothing there yet), got an existing non-socket file")


def _check_log(path: Path) -> None:
    key, expected = "decision_log_path", "a regular file path (JSON lines)"
    st = _stat_on_real_fs(key, path, expected, follow=True)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"key {key!r}: expected {expected}, got {str(path)!r}, which is not a regular file")


def _check_model(name: str, path: str) -> None:
    if path.startswith("zoo:"):
        return
    key = f"model {name!r} path"
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{key}: expected an .onnx file, got {path!r} ({exc.strerror})") from exc
    if not stat.S_ISREG(st.st_mode) or _fs_type(Path(path)) in PSEUDO_FS:
        raise ConfigError(f"{key}: expected an .onnx file (a regular file), got {path!r}")


def _check_board(board: str) -> None:
    from splitrt.profile import boards

    if ("/" in board or "\\" in board) and not board.endswith(".toml"):
        raise ConfigError(f"key 'board': expected a board name (devices/*.toml) or a .toml path, got {board!r}")
    try:
        boards.load_board(board)
    except ConfigError as exc:
        raise ConfigError(f"key 'board': {exc}") from exc


def preflight(config: Any) -> None:
    """``ConfigError`` for the first path or name in ``config`` (a ``DaemonConfig``) the start would fail on."""
    if config.api_socket_path is not None:
        _check_socket(Path(config.api_socket_path))
    if config.decision_log_path is not None:
        _check_log(Path(config.decision_log_path))
    if config.board:
        _check_board(config.board)
    for mc in config.models:
        _check_model(mc.name, mc.path)
