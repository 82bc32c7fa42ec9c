"""The link scenarios of a rig run: a trace named on the command line (shipped, a file, or synthetic)
and the round-trip time its family stands for."""

from __future__ import annotations

from pathlib import Path

from splitrt.errors import ConfigError
from splitrt.rig import traces

# One-way delay = rtt/2 on each direction of the relay. The traces carry no latency, so these are
# representative values, not measurements: 3G/HSPA round trips of several tens of ms up to ~100 ms
# (measurement studies of 3G vs LTE, e.g. Huang et al., MobiSys 2012, report 3G RTTs above LTE's);
# we take 80 ms. FCC: fixed broadband, tens of ms (FCC Measuring Broadband America); we take 30 ms.
# Override with ``--rtt-ms``.
FAMILY_RTT_MS = {"hsdpa": 80.0, "fcc": 30.0}
DEFAULT_RTT_MS = 50.0


def load_trace(spec: str) -> traces.Trace:
    """A shipped trace (``hsdpa/bus``), a file, or synthetic ``step:1,8,2[/5]`` (levels Mbit/s, step s),
    ``square:LOW,HIGH[,PERIOD]``, ``constant:MBPS``."""
    kind, _, arg = spec.partition(":")
    try:
        if kind == "step" and arg:
            levels, _, step_s = arg.partition("/")
            return traces.step([float(x) for x in levels.split(",")], float(step_s or 5.0))
        if kind == "square" and arg:
            parts = [float(x) for x in arg.split(",")]
            return traces.square(parts[0], parts[1], parts[2] if len(parts) > 2 else 20.0)
        if kind == "constant" and arg:
            return traces.constant(float(arg))
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"trace {spec!r}: expected step:L1,L2[/S], square:LOW,HIGH[,P] or constant:X") from exc
    if spec in traces.shipped():
        return traces.load_shipped(spec)
    if Path(spec).is_file():
        return traces.load(spec)
    raise ConfigError(
        f"trace {spec!r}: expected a shipped trace ({', '.join(traces.shipped())}), a file, or step:/square:/constant:"
    )


def trace_family(trace: traces.Trace) -> str | None:
    fam = trace.name.split("/", 1)[0]
    return fam if fam in FAMILY_RTT_MS else None


def typical_rtt_ms(trace: traces.Trace) -> float:
    """The round trip the trace's family stands for (the traces carry no latency)."""
    return FAMILY_RTT_MS.get(trace_family(trace) or "", DEFAULT_RTT_MS)


def family_median_mbps(family: str | None) -> float:
    """Time-weighted median bandwidth over the shipped traces of ``family`` (all shipped if None)."""
    names = [n for n in traces.shipped() if family is None or n.startswith(family + "/")]
    if not names:
        raise ConfigError(f"no shipped traces of family {family!r}")
    return traces.weighted_median((b - a, r) for n in names for a, b, r in traces.load_shipped(n).segments())
