"""Prometheus text exposition (format 0.0.4), by hand, and the tiny HTTP server that serves it.

Shared by the device daemon (``splitrt daemon``) and the cloud server (``splitrt serve --metrics-port``).
No ``prometheus_client`` dependency: the two need counters, gauges and a fixed-bucket histogram,
rendered on scrape from state the processes keep anyway; a registry of metric objects would be a
second copy of that state. ``parse`` reads the format back (tests and ``splitrt status``).

- ``promtext`` (Prometheus text 0.0.4, shared by the daemon and the cloud server): ``family(lines, name, kind,
  help, [(suffix, labels, value)])``, ``Histogram(buckets)`` (``.observe``, ``.samples(labels)``), ``parse(text)
  -> {(name, sorted labels): value}``, ``http_server(host, port, render)`` (``GET /metrics``; ConfigError on a
  taken port) and ``serve_in_thread(httpd) -> url``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from splitrt.errors import ConfigError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: (suffix, labels, value): one sample line of a family (suffix e.g. ``_bucket``, or "").
Sample = tuple[str, Mapping[str, str], float]


def label(value: str) -> str:
    """A label value escaped for the text format."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return "NaN" if math.isnan(x) else repr(float(x))


def family(lines: list[str], name: str, kind: str, help_text: str, samples: Sequence[Sample]) -> None:
    """Append one metric family (HELP, TYPE, its samples) to ``lines``."""
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for suffix, labels, value in samples:
        lab = ",".join(f'{k}="{label(v)}"' for k, v in labels.items())
        lines.append(f"{name}{suffix}{{{lab}}} {num(value)}" if lab else f"{name}{suffix} {num(value)}")


class Histogram:
    """Cumulative fixed-bucket histogram (not thread-safe: its owner locks)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(buckets) or not buckets:
            raise ConfigError(f"histogram buckets: expected a non-empty ascending list, got {list(buckets)}")
        self.bounds = tuple(float(b) for b in buckets)
        self._hits = [0] * len(self.bounds)  # per bucket, not cumulative: one increment per observation
        self.sum = 0.0
        self.count = 0

    @property
    def counts(self) -> list[int]:
        """Cumulative counts per bound (observations <= it)."""
        return list(itertools.accumulate(self._hits))

    def observe(self, x: float) -> None:
        if x <= self.bounds[-1]:  # (NaN is in no bucket)
            self._hits[bisect.bisect_left(self.bounds, x)] += 1
        self.sum += x
        self.count += 1

    def samples(self, labels: Mapping[str, str] | None = None) -> list[Sample]:
        base = dict(labels or {})
        out: list[Sample] = [
            ("_bucket", {**base, "le": num(b)}, float(c)) for b, c in zip(self.bounds, self.counts, strict=True)
        ]
        out.append(("_bucket", {**base, "le": "+Inf"}, float(self.count)))
        out.append(("_sum", base, self.sum))
        out.append(("_count", base, float(self.count)))
        return out


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)",?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples of a text exposition: ``{(name, sorted label pairs): value}`` (comments skipped).
    ``ConfigError`` names the first line that is not ``name{labels} value``."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        try:
            if m is None:
                raise ValueError(line)
            pairs = [
                (k, re.sub(r"\\.", lambda e: _UNESCAPE.get(e.group(0), e.group(0)), v))
                for k, v in _LABEL.findall(m.group(2) or "")
            ]
            out[(m.group(1), tuple(sorted(pairs)))] = float(m.group(3))
        except ValueError as exc:
            raise ConfigError(f"metrics: expected 'name{{labels}} value', got {line!r}") from exc
    return out


def http_server(host: str, port: int, render: Callable[[], str]) -> ThreadingHTTPServer:
    """A bound (not yet serving) HTTP server answering ``GET /metrics`` (and ``/``) with ``render()``;
    ``ConfigError`` when the port is taken. Call ``serve_in_thread`` (or ``serve_forever``) on it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "expected /metrics")
                return
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    try:
        httpd = ThreadingHTTPServer((host.strip("[]"), port), Handler)
    except OSError as exc:
        raise ConfigError(f"metrics {host}:{port}: expected a free port, got {exc.strerror or exc}") from exc
    httpd.daemon_threads = True
    return httpd


def serve_in_thread(httpd: ThreadingHTTPServer, name: str = "splitrt-metrics") -> str:
    """Serve ``httpd`` on a daemon thread; returns its ``http://host:port/metrics`` URL."""
    threading.Thread(target=httpd.serve_forever, name=name, daemon=True).start()
    host, port = httpd.server_address[:2]
    host_text = host.decode() if isinstance(host, bytes) else str(host)
    return f"http://{f'[{host_text}]' if ':' in host_text else host_text}:{port}/metrics"
