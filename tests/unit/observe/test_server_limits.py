"""The metrics/health port under clients that connect and do not ask, or ask slowly: probes
still answer, idle connections are closed, threads stay bounded (worker/observe/server.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from worker.observe.health import Health
from worker.observe.server import ObserveServer
from worker.observe.vitals import Vitals


class _NoMetrics:
    def collect(self) -> Iterator[object]:
        return iter(())


@contextlib.contextmanager
def _serving(blocked: Callable[[], str | None] = lambda: None, **limits: Any
             ) -> Iterator[ObserveServer]:
    health = Health(Vitals(), heartbeat_timeout_s=60, delivery_stall_s=15, fatal=lambda: None,
                    oldest_unacked_s=lambda: None, blocked=(blocked,))
    server = ObserveServer("127.0.0.1", 0, _NoMetrics(), health, **limits).start()
    try:
        yield server
    finally:
        server.close()


def _get(port: int, path: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _connect(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (an empty read, or a reset), None if it was
    still open after ``seconds``."""
    t0 = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_many_idle_connections_do_not_keep_healthz_from_answering() -> None:
    with _serving() as server:
        idle = _connect(server.port, 3 * 64)  # past the default cap on waiting connections
        try:
            t0 = time.monotonic()
            assert _get(server.port, "/healthz", timeout=1.0) == 200
            assert time.monotonic() - t0 < 1.0
        finally:
            for s in idle:
                s.close()


def test_an_idle_connection_is_closed_after_the_timeout() -> None:
    with _serving(timeout_s=0.5) as server:
        (sock,) = _connect(server.port, 1)
        with sock:
            took = _closed_within(sock, 5.0)
        assert took is not None, "the idle connection was still open after 5 s"
        assert 0.3 < took < 2.0, took


def test_a_request_head_trickled_in_is_closed_at_the_deadline_not_per_byte() -> None:
    # A byte every 0.1 s comes well inside the timeout; the whole head does not.
    with _serving(timeout_s=0.5) as server:
        (sock,) = _connect(server.port, 1)
        with sock:
            t0, closed_after = time.monotonic(), None
            sock.settimeout(0.1)
            for byte in b"GET /healthz HTTP/1.0\r\nX-Slow: " + b"x" * 100:
                try:
                    sock.send(bytes([byte]))
                    if sock.recv(1) == b"":
                        closed_after = time.monotonic() - t0
                        break
                except TimeoutError:
                    continue  # still open: the next byte
                except OSError:  # (a reset)
                    closed_after = time.monotonic() - t0
                    break
        assert closed_after is not None, "a trickling client kept its connection for 13 s"
        assert closed_after < 2.0, closed_after


def test_threads_stay_bounded_whatever_the_connections() -> None:
    workers = 3
    with _serving(workers=workers, timeout_s=3.0) as server:
        assert _get(server.port, "/healthz") == 200  # (the pool's first thread exists)
        before = threading.active_count()
        idle = _connect(server.port, 60)
        partial = _connect(server.port, 20)
        try:
            for s in partial:
                s.send(b"GET /metrics HTTP/1.1\r\n")
            answers: list[int] = []
            getters = [threading.Thread(target=lambda: answers.append(
                _get(server.port, "/readyz"))) for _ in range(10)]
            for g in getters:
                g.start()
            time.sleep(0.5)
            grown = threading.active_count() - before - len(getters)
            for g in getters:
                g.join(10)
            assert grown <= workers, f"{grown} threads for 80 connections (cap {workers})"
            assert set(answers) <= {200, 503, 500} and len(answers) == 10
        finally:
            for s in idle + partial:
                s.close()


def test_a_request_that_finds_every_worker_busy_gets_503_at_once() -> None:
    release = threading.Event()

    def slow() -> str | None:
        release.wait(10)
        return None

    with _serving(blocked=slow, workers=2) as server:
        statuses: list[int] = []
        busy = [threading.Thread(target=lambda: statuses.append(_get(server.port, "/readyz")))
                for _ in range(2)]
        for t in busy:
            t.start()
        time.sleep(0.5)  # both workers now wait in the slow readiness check
        t0 = time.monotonic()
        assert _get(server.port, "/healthz", timeout=2.0) == 503
        assert time.monotonic() - t0 < 1.0
        release.set()
        for t in busy:
            t.join(10)
        assert statuses == [503, 503], "(not warm: readiness answers 503 with its reasons)"
        assert _get(server.port, "/healthz") == 200, "the workers are free again"


def test_past_the_cap_the_oldest_waiting_connection_is_closed() -> None:
    with _serving(max_connections=4, timeout_s=30.0) as server:
        first, *others = _connect(server.port, 5)
        try:
            assert _closed_within(first, 2.0) is not None, "the oldest is closed for room"
            assert all(_closed_within(s, 0.2) is None for s in others), "the newer wait on"
        finally:
            for s in (first, *others):
                s.close()


def test_an_ipv6_host_is_served() -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    health = Health(Vitals(), heartbeat_timeout_s=60, delivery_stall_s=15, fatal=lambda: None,
                    oldest_unacked_s=lambda: None)
    server = ObserveServer("::1", 0, _NoMetrics(), health).start()
    try:
        with urllib.request.urlopen(f"http://[::1]:{server.port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        server.close()
