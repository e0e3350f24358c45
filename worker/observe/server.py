"""One HTTP port: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness).

prometheus_client's WSGI app renders the metrics and the standard library's wsgiref handler
answers each request; only the three routes are ours. Serving runs on daemon threads: the loop
never waits on a scrape.

Bounded, so that no client can starve the probes or pile up threads (slowloris): one thread
("observe") accepts connections and reads each request's head without blocking; a connection
costs a thread only once its whole head has arrived, and then one of ``workers`` threads
answers it, with ``timeout_s`` to take the answer. A connection that has not sent its whole
head within ``timeout_s`` of connecting is closed (an idle one, or one trickling bytes); at
most ``max_connections`` wait for their heads, the oldest closed to make room, so a kubelet
probe (which sends its request at once) gets through however many idle connections there are.
A complete request that finds every worker busy is answered 503 at once.
"""

from __future__ import annotations

import contextlib
import io
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client import make_wsgi_app as metrics_app
from prometheus_client.registry import Collector

from worker.exceptions import ConfigError
from worker.observe.health import Probes, Verdict

log = structlog.get_logger("worker")

StartResponse = Callable[..., Any]

# Requests answered at once. A scrape renders in milliseconds, and a probe in less.
WORKERS = 4
# Connections waiting for their request's head; the oldest is closed beyond that.
MAX_CONNECTIONS = 64
# To send the whole request head after connecting, and to take the whole answer.
TIMEOUT_S = 5.0
# A longer head is refused (the three routes need a request line and a few headers).
MAX_HEAD_BYTES = 16 * 1024

_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
         b"Content-Length: 5\r\nRetry-After: 1\r\nConnection: close\r\n\r\nbusy\n")
_TOO_LARGE = (b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
              b"Connection: close\r\n\r\n")


class _Server(WSGIServer):
    """Binds the port and builds each request's environ; :class:`ObserveServer` serves."""

    allow_reuse_address = True
    request_queue_size = 128  # a burst of connections waits in the kernel, not refused
    answer_timeout_s = TIMEOUT_S


class _Server6(_Server):
    address_family = socket.AF_INET6  # an IPv6 host (an IPv6 pod IP, or "::")


class _Handler(WSGIRequestHandler):
    """Answers one request whose head (``received``) the accepting thread already read."""

    def __init__(self, conn: socket.socket, received: bytes, addr: Any, server: _Server
                 ) -> None:
        self._received = received
        super().__init__(conn, addr, server)  # (answers the request)

    def setup(self) -> None:
        self.connection = self.request
        assert isinstance(self.server, _Server)
        self.connection.settimeout(self.server.answer_timeout_s)
        self.rfile = io.BytesIO(self._received)
        self.wfile = self.connection.makefile("wb")  # (buffered: finish() sends it whole)

    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log."""


def _answer(verdict: Verdict, start_response: StartResponse) -> Iterable[bytes]:
    status = "200 OK" if verdict.ok else "503 Service Unavailable"
    body = verdict.text().encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body)))])
    return [body]


def make_app(registry: CollectorRegistry, health: Probes) -> Callable[..., Iterable[bytes]]:
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


class _Waiting:
    """A connection whose request head is still coming."""

    __slots__ = ("addr", "deadline", "head")

    def __init__(self, addr: Any, deadline: float) -> None:
        self.addr, self.deadline, self.head = addr, deadline, bytearray()


def _close(sock: socket.socket, reply: bytes = b"") -> None:
    with contextlib.suppress(OSError):
        if reply:
            sock.send(reply)  # (non-blocking: a short answer fits any fresh socket's buffer)
        sock.shutdown(socket.SHUT_WR)
    sock.close()


class ObserveServer:
    def __init__(self, host: str, port: int, collector: Collector, health: Probes, *,
                 workers: int = WORKERS, max_connections: int = MAX_CONNECTIONS,
                 timeout_s: float = TIMEOUT_S) -> None:
        registry = CollectorRegistry()
        registry.register(collector)
        ProcessCollector(registry=registry)  # (each registers itself)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        try:
            self._httpd = make_server(host, port, make_app(registry, health),
                                      server_class=_Server6 if ":" in host else _Server,
                                      handler_class=_Handler)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc} "
                              "(set metrics.port, or 0 to turn it off)") from exc
        assert isinstance(self._httpd, _Server)
        self._httpd.answer_timeout_s = timeout_s
        self._httpd.socket.setblocking(False)
        self.port = self._httpd.server_port
        self.timeout_s, self.max_connections = timeout_s, max_connections
        self._slots = threading.BoundedSemaphore(workers)  # a worker free to answer
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="observe-answer")
        self._waiting: dict[socket.socket, _Waiting] = {}  # oldest first
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # close() interrupts the select
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="observe", daemon=True)

    def start(self) -> ObserveServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if self._thread.is_alive():
            self._thread.join(5.0)
        else:  # (never started: nothing else closes these)
            self._selector.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._httpd.server_close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the accepting thread --------------------------------------------------------------
    def _serve(self) -> None:
        listener = self._httpd.socket
        self._selector.register(listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._closing:
                now = time.monotonic()
                first = next(iter(self._waiting.values()), None)
                wait = 1.0 if first is None else min(max(first.deadline - now, 0.0), 1.0)
                for key, _ in self._selector.select(wait):
                    if key.fileobj is listener:
                        self._accept(listener)
                    elif key.fileobj is not self._wake_r:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._expire(time.monotonic())
        except Exception as exc:  # noqa: BLE001 - a dead server must say why in the log
            log.error("metrics_server_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            for sock in list(self._waiting):
                self._drop(sock)
            self._selector.close()

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(self.max_connections):  # what is there now; the rest next round
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: the next round retries
                log.debug("metrics_accept_failed", error=str(exc)[:200])
                return
            while len(self._waiting) >= self.max_connections:
                self._drop(next(iter(self._waiting)))  # the oldest: likely idle, not a probe
            sock.setblocking(False)
            self._waiting[sock] = _Waiting(addr, time.monotonic() + self.timeout_s)
            self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, sock: socket.socket) -> None:
        waiting = self._waiting.get(sock)
        if waiting is None:
            return
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        start = max(len(waiting.head) - 3, 0)
        waiting.head += data
        if b"\r\n\r\n" in waiting.head[start:] or b"\n\n" in waiting.head[start:]:
            self._unwait(sock)
            if not self._slots.acquire(blocking=False):
                _close(sock, _BUSY)
                return
            try:
                self._pool.submit(self._answer, sock, waiting.addr, bytes(waiting.head))
            except RuntimeError:  # the pool was shut down: close() is under way
                self._slots.release()
                _close(sock)
        elif len(waiting.head) > MAX_HEAD_BYTES:
            self._unwait(sock)
            _close(sock, _TOO_LARGE)

    def _expire(self, now: float) -> None:
        for sock, waiting in list(self._waiting.items()):
            if waiting.deadline > now:
                break  # (deadlines grow in arrival order)
            self._drop(sock)

    def _unwait(self, sock: socket.socket) -> None:
        del self._waiting[sock]
        self._selector.unregister(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._unwait(sock)
        _close(sock)

    # -- a worker thread ---------------------------------------------------------------------
    def _answer(self, sock: socket.socket, addr: Any, head: bytes) -> None:
        try:
            sock.setblocking(True)
            _Handler(sock, head, addr, self._httpd)
        except Exception as exc:  # noqa: BLE001 - one client's failure is not the server's
            log.debug("metrics_request_failed", error=f"{type(exc).__name__}: {exc}"[:200])
        finally:
            _close(sock)
            self._slots.release()
