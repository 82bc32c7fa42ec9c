"""Prometheus text read back with prometheus_client's own parser, for the metrics tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """``{(sample name, sorted label pairs): value}``; every family must be typed (a sample with no TYPE
    line before it, or of a type we never export, fails) and every line must parse."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        assert fam.type in ("counter", "gauge", "histogram"), f"{fam.name}: untyped or unexpected {fam.type!r}"
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out
