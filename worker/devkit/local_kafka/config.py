"""Files and identifiers for a single-node KRaft broker+controller."""

from __future__ import annotations

import base64
import shutil
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path


def free_port() -> int:
    """An ephemeral port that is free on 127.0.0.1 right now.

    Racy by nature (someone may grab it before the broker binds); the broker
    start logic retries with fresh ports when it sees a bind failure.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def random_cluster_id() -> str:
    """Kafka `Uuid` text form: 16 random bytes, URL-safe base64 without padding.

    Kafka's own generator rejects ids starting with '-' because they parse as
    CLI flags; we do the same since the id goes on StorageTool's command line.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def server_properties(
    *,
    broker_port: int,
    controller_port: int,
    data_dir: Path,
    num_partitions: int,
    extra: Mapping[str, str] | None = None,
    extra_listeners: Mapping[str, tuple[int, int]] | None = None,
    secured_listeners: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """``secured_listeners``: name -> port of listeners whose security protocol is their name
    (SASL_SSL, SSL; their settings come in ``extra``, see security.py).

    ``extra_listeners``: more PLAINTEXT listeners, name -> (port bound, port advertised),
    e.g. one advertised at a proxy's port so clients that bootstrap through the proxy keep
    talking through it (the broker answers metadata with the listener's advertised address)."""
    host = "127.0.0.1"
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        # Dynamic (KIP-853) quorum, the 4.x default; paired with `format --standalone`.
        "controller.quorum.bootstrap.servers": f"{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{broker_port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{broker_port},CONTROLLER://{host}:{controller_port}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": str(num_partitions),
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        # Internal topics default to RF 3 / 50 partitions; a single node needs RF 1,
        # and fewer partitions make the first group/transaction use much faster.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # Keep disk use small; 4.x rejects segment.bytes below 1 MiB.
        "log.segment.bytes": str(8 * 1024 * 1024),
        "log.index.size.max.bytes": str(1024 * 1024),
        "num.network.threads": "2",
        "num.io.threads": "4",
    }
    for name, (bound, advertised) in (extra_listeners or {}).items():
        props["listeners"] += f",{name}://{host}:{bound}"
        props["advertised.listeners"] += f",{name}://{host}:{advertised}"
        props["listener.security.protocol.map"] += f",{name}:PLAINTEXT"
    for name, port in (secured_listeners or {}).items():
        props["listeners"] += f",{name}://{host}:{port}"
        props["advertised.listeners"] += f",{name}://{host}:{port}"
        props["listener.security.protocol.map"] += f",{name}:{name}"
    props.update(extra or {})
    return props


def render_properties(props: Mapping[str, str]) -> str:
    # Values we generate never contain characters needing .properties escaping
    # except backslashes (none on POSIX paths); escape them anyway.
    return "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in props.items())


def log4j2_properties(log_file: Path) -> str:
    """log4j2 config appending everything to `log_file`.

    The broker's stdout/stderr are redirected (O_APPEND) to the same file, so
    JVM crashes and log4j status messages end up next to the broker log.
    """
    return f"""\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
"""


def write_attempt_files(
    workdir: Path, log_file: Path, attempt: int, num_partitions: int, extra: Mapping[str, str],
    extra_listeners: Mapping[str, tuple[int, int]] | None = None,
    secured_names: tuple[str, ...] = (),
) -> tuple[dict[str, int], Path, Path]:
    """Pick ports and write server.properties + log4j2.properties for one start attempt.

    Returns ({listener: port} for PLAINTEXT and ``secured_names``, properties_file,
    log4j2_file). Each attempt gets its own
    data dir because a `--standalone` format records the controller endpoint.
    """
    ports: dict[str, int] = {}
    for name in ("PLAINTEXT", "CONTROLLER", *secured_names):
        port = free_port()
        while port in ports.values():
            port = free_port()
        ports[name] = port
    data_dir = workdir / f"data-{attempt}"
    shutil.rmtree(data_dir, ignore_errors=True)  # a reused workdir holds an old format
    props = server_properties(
        broker_port=ports["PLAINTEXT"],
        controller_port=ports.pop("CONTROLLER"),
        data_dir=data_dir,
        num_partitions=num_partitions,
        extra=extra,
        extra_listeners=extra_listeners,
        secured_listeners={name: ports[name] for name in secured_names},
    )
    props_file = workdir / "server.properties"
    props_file.write_text(render_properties(props))
    log4j_file = workdir / "log4j2.properties"
    log4j_file.write_text(log4j2_properties(log_file))
    return ports, props_file, log4j_file


def cluster_node_properties(
    *,
    node_id: int,
    broker_port: int,
    controller_port: int,
    voters: Mapping[int, int],
    data_dir: Path,
    num_partitions: int,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """One combined broker+controller node of a static KRaft quorum (``voters``: node id ->
    controller port, every node a voter).

    Durability as a production cluster has it: replication factor 3 (or the node count if
    smaller), ``min.insync.replicas`` 2, the same for the transaction state log, the offsets
    topic replicated 3 times; so one node down keeps every partition writable with acks=all and
    two down refuse writes rather than lose them."""
    nodes = len(voters)
    rf = min(3, nodes)
    min_isr = max(1, rf - 1)
    props = server_properties(broker_port=broker_port, controller_port=controller_port,
                              data_dir=data_dir, num_partitions=num_partitions)
    # A static quorum (controller.quorum.voters, formatted without --standalone): every node
    # knows every voter from its first start, so restarting one never needs a membership change.
    del props["controller.quorum.bootstrap.servers"]
    props.update({
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(f"{n}@127.0.0.1:{port}"
                                             for n, port in sorted(voters.items())),
        "default.replication.factor": str(rf),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(rf),
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        # Three JVMs share a small machine: fewer request threads each.
        "num.io.threads": "2",
    })
    props.update(extra or {})
    return props
