"""CLI: `python -m worker.devkit.local_kafka fetch|run`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from .broker import LocalKafka
from .cluster import LocalKafkaCluster
from .errors import LocalKafkaError
from .jars import DEFAULT_VERSION, ensure_jars
from .security import Protocol, Security


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker.devkit.local_kafka")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="resolve broker jars into the cache (CI pre-warm)")
    run = sub.add_parser("run", help="run a broker in the foreground until Ctrl-C/SIGTERM")
    for p in (fetch, run):
        p.add_argument("--version", default=DEFAULT_VERSION, help="Kafka version (%(default)s)")
        p.add_argument("--cache-dir", type=Path, default=None, help="jar cache root")
    run.add_argument("--workdir", type=Path, default=None, help="keep data/logs here")
    run.add_argument("--partitions", type=int, default=1, help="default partitions per topic")
    run.add_argument("--topic", action="append", default=[], help="topic to create (repeatable)")
    run.add_argument("--timeout", type=float, default=90.0, help="start timeout in seconds")
    run.add_argument("--sasl-ssl", action="store_true",
                     help="add a SASL_SSL (SCRAM-SHA-512) listener and an authorizer")
    run.add_argument("--mtls", action="store_true",
                     help="add an mTLS listener (client certificates) and an authorizer")
    run.add_argument("--brokers", type=int, default=1,
                     help="nodes: 1 (default), or 2+ for a KRaft cluster (3: RF 3, min ISR "
                          "2); PLAINTEXT only")
    return parser


def _run(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # SIGTERM must unwind through stop() just like Ctrl-C so the JVM is not orphaned.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    security = (Security(sasl_ssl=args.sasl_ssl, mtls=args.mtls)
                if args.sasl_ssl or args.mtls else None)
    if args.brokers > 1:
        if security is not None:
            raise LocalKafkaError("--brokers > 1 runs PLAINTEXT only (no --sasl-ssl / --mtls)")
        return _run_cluster(args, stop)
    broker = LocalKafka(version=args.version, workdir=args.workdir, cache_dir=args.cache_dir,
                        num_partitions=args.partitions, security=security)
    started = time.monotonic()
    try:
        broker.start(timeout=args.timeout)
        if args.topic:
            broker.create_topics(args.topic, partitions=args.partitions)
        print(broker.bootstrap_servers, flush=True)
        if security is not None:
            su = broker.super_principal
            assert su is not None
            protocols: list[Protocol] = ["SASL_SSL"] if security.sasl_ssl else []
            protocols += ["SSL"] if security.mtls else []
            listeners = ", ".join(f"{p} {broker.secure_bootstrap(p)}" for p in protocols)
            scram = f"; SCRAM super user {su.name} / {su.password}" if security.sasl_ssl else ""
            print(f"# secured listeners: {listeners}; CA {broker.ca_location}; the listener "
                  f"above is the super user's{scram}",
                  file=sys.stderr, flush=True)
        print(f"# ready in {time.monotonic() - started:.1f}s; log: {broker.log_path}; "
              "Ctrl-C to stop", file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            if not broker.is_running():
                print(f"broker exited unexpectedly; see {broker.log_path}", file=sys.stderr)
                return 1
    finally:
        broker.stop()
    return 0


def _run_cluster(args: argparse.Namespace, stop: threading.Event) -> int:
    cluster = LocalKafkaCluster(args.brokers, version=args.version, workdir=args.workdir,
                                cache_dir=args.cache_dir, num_partitions=args.partitions)
    started = time.monotonic()
    try:
        cluster.start(timeout=max(args.timeout, 180.0))
        if args.topic:
            cluster.create_topics(args.topic, partitions=args.partitions)
        print(cluster.bootstrap_servers, flush=True)
        print(f"# {args.brokers} nodes ready in {time.monotonic() - started:.1f}s; logs under "
              f"{cluster.workdir}; Ctrl-C to stop", file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            if len(cluster.running()) < args.brokers:
                print(f"a node exited unexpectedly; see {cluster.workdir}", file=sys.stderr)
                return 1
    finally:
        cluster.stop()
    return 0


def run_cli(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        if args.command == "fetch":
            print(ensure_jars(args.version, args.cache_dir))
            return 0
        return _run(args)
    except LocalKafkaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run_cli())
