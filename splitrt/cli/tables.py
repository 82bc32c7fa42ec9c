"""Plain-text tables for the CLI and the benchmarks (every table also has a --json form)."""

from __future__ import annotations

from collections.abc import Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(values, widths, strict=True))

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(s.rstrip() for s in out)


#: Longest name a table cell shows (the --json form keeps every name whole).
NAME_WIDTH = 48


def short(name: str, width: int = NAME_WIDTH) -> str:
    """``name`` cut in the middle to ``width`` characters (both ends kept: exporters put the layer's path
    first and the op last), unchanged when it fits."""
    if len(name) <= width:
        return name
    keep = width - 3
    return name[: (keep + 1) // 2] + "..." + name[len(name) - keep // 2 :]


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def _numeric(s: str) -> bool:
    try:
        float(s.rstrip("%x"))
    except ValueError:
        return False
    return True


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)
