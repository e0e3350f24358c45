"""One HTTP port: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness).

prometheus_client's WSGI app renders the metrics and the standard library's threading WSGI
server (the one prometheus_client's own ``start_http_server`` uses) serves them; only the three
routes are ours. It runs on a daemon thread: the loop never waits on a scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client import make_wsgi_app as metrics_app
from prometheus_client.registry import Collector

from worker.exceptions import ConfigError
from worker.observe.health import Health, Verdict

StartResponse = Callable[..., Any]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log."""


def _answer(verdict: Verdict, start_response: StartResponse) -> Iterable[bytes]:
    status = "200 OK" if verdict.ok else "503 Service Unavailable"
    body = verdict.text().encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body)))])
    return [body]


def make_app(registry: CollectorRegistry, health: Health) -> Callable[..., Iterable[bytes]]:
    metrics = metrics_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            return _answer(health.live(), start_response)
        if path == "/readyz":
            return _answer(health.ready(), start_response)
        if path == "/metrics":
            result: Iterable[bytes] = metrics(environ, start_response)
            return result
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"/metrics, /healthz or /readyz\n"]

    return app


class ObserveServer:
    def __init__(self, host: str, port: int, collector: Collector, health: Health) -> None:
        registry = CollectorRegistry()
        registry.register(collector)
        ProcessCollector(registry=registry)  # (each registers itself)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        try:
            self._httpd = make_server(host, port, make_app(registry, health),
                                      server_class=_Server, handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc} "
                              "(set metrics.port, or 0 to turn it off)") from exc
        self.port = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="observe",
                                        daemon=True)

    def start(self) -> ObserveServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():  # (shutdown() waits for a serve_forever that never ran)
            self._httpd.shutdown()
        self._httpd.server_close()
