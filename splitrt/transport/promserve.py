"""Serve a ``prometheus_client`` registry on ``GET /metrics``: the HTTP endpoint the device daemon
(``splitrt daemon``) and the cloud server (``splitrt serve --metrics-port``) share.

- ``serve(registry, host, port, name=) -> (httpd, url)``: a daemon thread serves prometheus_client's WSGI
  app on ``http://host:port/metrics`` (and ``/``; any other path is 404); ``ConfigError`` names a taken
  port. Stop it with ``httpd.shutdown(); httpd.server_close()``.
- ``family(kind, name, doc, labels, rows)``: a counter or gauge family with one sample per
  ``(label values, value)`` row, for the collectors.

The text is prometheus_client's (format 0.0.4 unless the scraper asks for another); the processes
register custom collectors that render the state they keep anyway on each scrape.
Not ``start_http_server``: it answers every path with the metrics and raises a bare ``OSError`` on a
taken port; this wraps its WSGI app for a 404 and a ``ConfigError``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric

from splitrt.errors import ConfigError

_PATHS = ("/metrics", "/")


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        return


class _Server6(ThreadingWSGIServer):
    address_family = socket.AF_INET6


def serve(
    registry: CollectorRegistry, host: str, port: int, *, name: str = "splitrt-metrics"
) -> tuple[WSGIServer, str]:
    """Bind ``host:port`` and serve ``registry`` on a daemon thread; returns (httpd, its metrics URL)."""
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in _PATHS:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"expected /metrics\n"]
        out: Iterable[bytes] = metrics_app(environ, start_response)
        return out

    bare = host.strip("[]")
    server_class = _Server6 if ":" in bare else ThreadingWSGIServer
    try:
        httpd = make_server(bare, port, app, server_class, handler_class=_Quiet)
    except OSError as exc:
        raise ConfigError(f"metrics {host}:{port}: expected a free port, got {exc.strerror or exc}") from exc
    threading.Thread(target=httpd.serve_forever, name=name, daemon=True).start()
    bound = httpd.server_address[1]
    return httpd, f"http://{f'[{bare}]' if ':' in bare else bare}:{bound}/metrics"


def family(
    kind: type[CounterMetricFamily | GaugeMetricFamily],
    name: str,
    doc: str,
    labels: Sequence[str],
    rows: Iterable[tuple[Sequence[str], float]],
) -> Metric:
    """A ``kind`` family named ``name`` with one sample per (label values, value) row."""
    fam = kind(name, doc, labels=labels)
    for values, value in rows:
        fam.add_metric(list(values), value)
    return fam
