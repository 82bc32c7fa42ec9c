"""Implausible profiles: what a short profile on a busy host looks like, said before anyone plans on it.

A head can never cost more than the whole model, and a head that contains another (its node set is a
superset) can never be cheaper than it; likewise a tail that is contained in another is never dearer.
A profile that says otherwise measured noise (another process took the cores during a few timed runs).
``implausible`` names the cuts that break these rules by more than ``tolerance`` of the whole model's
time, so ``splitrt profile`` and ``splitrt plan`` warn and suggest more repeats.
"""

from __future__ import annotations

from splitrt.profile.store import Profile

#: Noise allowed before a contradiction is reported, as a fraction of the whole model's time (and at least
#: ``MIN_MS``): interpolated cuts between two anchors wobble by a few percent on a quiet host too.
TOLERANCE = 0.10
MIN_MS = 0.05
SHOWN = 4


def implausible(profile: Profile, *, tolerance: float = TOLERANCE) -> list[str]:
    """One line per kind of contradiction, naming (up to ``SHOWN``) cuts; empty when the profile is sane."""
    total = float(profile.total_ms)
    slack = max(tolerance * total, MIN_MS)
    cuts = list(profile.cuts)
    dearer = [c for c in cuts if c.cut != "cloud" and c.head_ms > total + slack]
    tail_dearer = [c for c in cuts if c.cut != "device" and c.tail_ms > total + slack]
    masks = [int(c.head_mask or "0", 16) for c in cuts]
    order = sorted(range(len(cuts)), key=lambda i: bin(masks[i]).count("1"))
    heads: list[str] = []
    tails: list[str] = []
    for b_pos, j in enumerate(order):
        big = cuts[j]
        inside = [i for i in order[:b_pos] if not masks[i] & ~masks[j] and masks[i] != masks[j]]
        if not inside:
            continue
        # the dearest head it contains, and the cheapest tail containing its tail
        dear = max((i for i in inside if cuts[i].cut != "cloud"), key=lambda i: cuts[i].head_ms, default=None)
        if dear is not None and big.cut != "cloud" and cuts[dear].head_ms - big.head_ms > slack:
            heads.append(f"{big.cut} {big.head_ms:.2f} ms < {cuts[dear].cut} {cuts[dear].head_ms:.2f} ms")
        cheap = min(inside, key=lambda i: cuts[i].tail_ms)
        if big.cut != "device" and big.tail_ms - cuts[cheap].tail_ms > slack:
            tails.append(f"{big.cut} {big.tail_ms:.2f} ms > {cuts[cheap].cut} {cuts[cheap].tail_ms:.2f} ms")
    out: list[str] = []
    if dearer:
        out.append(
            f"heads dearer than the whole model ({total:.2f} ms): "
            + _names([f"{c.cut} {c.head_ms:.2f} ms" for c in dearer])
        )
    if tail_dearer:
        out.append(
            f"tails dearer than the whole model ({total:.2f} ms): "
            + _names([f"{c.cut} {c.tail_ms:.2f} ms" for c in tail_dearer])
        )
    if heads:
        out.append("bigger heads cheaper than smaller heads they contain: " + _names(heads))
    if tails:
        out.append("smaller tails dearer than bigger tails that contain them: " + _names(tails))
    return out


def _names(items: list[str]) -> str:
    more = f" (and {len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return "; ".join(items[:SHOWN]) + more


def warning(profile: Profile, label: str) -> str | None:
    """The whole warning for ``label`` (a profile's file name), or None when nothing is implausible."""
    lines = implausible(profile)
    if not lines:
        return None
    runs = int(profile.runtime.get("runs", 0) or 0)
    more = max(30, 3 * runs)
    return (
        f"warning: profile {label} looks noisy (a busy host or too few runs: {runs} per segment): "
        + " | ".join(lines)
        + f". Re-profile with more repeats (--runs {more}) on a quieter host; "
        "plans made on it may pick the wrong cut"
    )
