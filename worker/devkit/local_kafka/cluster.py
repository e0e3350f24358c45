"""LocalKafkaCluster: a throwaway KRaft cluster of combined broker+controller nodes.

Every node is a voter of a static quorum (three nodes: three voters, one may be lost) and a
broker; topics are replicated 3 times with ``min.insync.replicas=2`` (see
config.cluster_node_properties). The fault helpers act on one node: ``kill9``/``restart`` (same
ports, same data), ``pause``/``resume`` (SIGSTOP/SIGCONT: connections stay open, nothing
answers), and find the node that matters: a partition's leader, a group's coordinator, a
transactional id's coordinator.

PLAINTEXT only (no ``Security``): it is for fault drills, LocalKafka for the secured broker.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import config, process, workspace
from .errors import LocalKafkaError
from .jars import DEFAULT_VERSION, ensure_jars

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._metadata import ClusterMetadata

log = logging.getLogger(__name__)
BIND_ATTEMPTS = 3  # free_port() is racy; retry with new ports on a bind clash
# Three JVMs next to the workers on a 2-core, small-memory machine: the drills move a few
# thousand small records, far below what 384 MiB of heap serves.
CLUSTER_HEAP = ["-Xms64m", "-Xmx384m"]
TRANSACTION_STATE_TOPIC = "__transaction_state"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: over UTF-16 code units, 32-bit signed arithmetic."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of ``__transaction_state`` (or ``__consumer_offsets``) that holds ``key``:
    Kafka's ``Utils.abs(key.hashCode()) % partitions``, where abs(Integer.MIN_VALUE) is 0."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


@dataclass
class ClusterNode:
    """One broker+controller JVM: its ports and files stay the same across restarts."""

    node_id: int
    workdir: Path
    broker_port: int = 0
    controller_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    data_dir: Path = field(default_factory=Path)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    @property
    def props_file(self) -> Path:
        return self.workdir / "server.properties"

    @property
    def log4j_file(self) -> Path:
        return self.workdir / "log4j2.properties"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalKafkaCluster(process.Runs):
    """Context manager around ``brokers`` KRaft JVMs; nothing happens until start().

    Restart nodes from the thread that started the cluster (or another long-lived one): a
    broker gets SIGTERM when the thread that launched it exits (process.launch_broker)."""

    def __init__(
        self,
        brokers: int = 3,
        *,
        version: str = DEFAULT_VERSION,
        workdir: Path | None = None,
        cache_dir: Path | None = None,
        num_partitions: int = 1,
        extra_config: dict[str, str] | None = None,
        keep_logs_on_failure: bool = True,
        heap: list[str] | None = None,
    ) -> None:
        if brokers < 2:
            raise LocalKafkaError("LocalKafkaCluster needs 2 or more nodes; LocalKafka is one")
        self.brokers = brokers
        self.version = version
        self.cache_dir = cache_dir
        self.num_partitions = num_partitions
        self.extra_config = dict(extra_config or {})
        self.keep_logs_on_failure = keep_logs_on_failure
        self.heap = list(heap or CLUSTER_HEAP)
        self.nodes: dict[int, ClusterNode] = {}
        self._given_workdir = workdir
        self._tmpdir: Path | None = None
        self._workdir: Path | None = None
        self._libs: Path | None = None
        self._failed = False
        self._started = False
        self._admin: AdminClient | None = None

    # -- addresses ---------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        """Every node's PLAINTEXT listener: clients bootstrap through whichever answers."""
        if not self._started:
            raise LocalKafkaError("LocalKafkaCluster not started")
        return ",".join(n.bootstrap for n in self.nodes.values())

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise LocalKafkaError("LocalKafkaCluster not started")
        return self._workdir

    def node(self, node_id: int) -> ClusterNode:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise LocalKafkaError(f"no node {node_id} (nodes: {sorted(self.nodes)})") from None

    def running(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.is_running()]

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 180.0) -> str:
        """Format every node's storage, launch them, block until each is a live broker."""
        if self._started:
            return self.bootstrap_servers
        self._libs = ensure_jars(self.version, self.cache_dir)
        self._workdir, self._tmpdir = workspace.acquire(self._given_workdir)
        self._failed = False
        deadline = time.monotonic() + timeout
        try:
            for attempt in range(1, BIND_ATTEMPTS + 1):
                offsets = {i: process.file_size(self.workdir / f"node-{i}" / "broker.log")
                           for i in range(1, self.brokers + 1)}
                try:
                    return self._start_once(attempt, max(1.0, deadline - time.monotonic()))
                except LocalKafkaError:
                    self._kill_all()
                    clash = any(b"Address already in use" in process.appended_since(
                        n.log_path, offsets.get(i, 0)) for i, n in self.nodes.items())
                    if attempt == BIND_ATTEMPTS or not clash:
                        raise
                    log.warning("local Kafka cluster port clash, retrying with new ports")
        except BaseException:
            self._failed = True
            self._cleanup()
            raise
        raise AssertionError("unreachable")

    def _start_once(self, attempt: int, timeout: float) -> str:
        assert self._libs is not None
        started = time.monotonic()
        taken: set[int] = set()

        def port() -> int:
            p = config.free_port()
            while p in taken:
                p = config.free_port()
            taken.add(p)
            return p

        self.nodes = {}
        for i in range(1, self.brokers + 1):
            node = ClusterNode(i, self.workdir / f"node-{i}", port(), port())
            node.workdir.mkdir(parents=True, exist_ok=True)
            node.data_dir = node.workdir / f"data-{attempt}"
            self.nodes[i] = node
        voters = {i: n.controller_port for i, n in self.nodes.items()}
        cluster_id = config.random_cluster_id()
        for node in self.nodes.values():
            props = config.cluster_node_properties(
                node_id=node.node_id, broker_port=node.broker_port,
                controller_port=node.controller_port, voters=voters, data_dir=node.data_dir,
                num_partitions=self.num_partitions, extra=self.extra_config)
            node.props_file.write_text(config.render_properties(props))
            node.log4j_file.write_text(config.log4j2_properties(node.log_path))
        self._format_all(cluster_id)
        for node in self.nodes.values():
            node.proc = process.launch_broker(self._libs, node.log4j_file, node.props_file,
                                              node.log_path, heap=self.heap)
        self._started = True
        try:
            self.wait_brokers(set(self.nodes), max(1.0, timeout - (time.monotonic() - started)))
        except BaseException:
            self._started = False
            raise
        log.info("local Kafka cluster %s (%d nodes) up at %s in %.1fs (workdir %s)",
                 self.version, self.brokers, self.bootstrap_servers,
                 time.monotonic() - started, self.workdir)
        return self.bootstrap_servers

    def _format_all(self, cluster_id: str) -> None:
        """One StorageTool JVM per node, side by side (each takes seconds to start)."""
        assert self._libs is not None
        libs = self._libs
        errors: list[BaseException] = []

        def fmt(node: ClusterNode) -> None:
            try:
                process.format_storage(libs, node.log4j_file, node.props_file, cluster_id,
                                       node.log_path, standalone=False, heap=self.heap)
            except BaseException as exc:  # noqa: BLE001 - re-raised below in this thread
                errors.append(exc)

        threads = [threading.Thread(target=fmt, args=(n,), name=f"format-{n.node_id}")
                   for n in self.nodes.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def stop(self, timeout: float = 30.0) -> None:
        """Controlled shutdown of every node (SIGTERM, SIGKILL after ``timeout``), then
        remove the temporary workdir. The nodes stop together: one by one, the last ones
        would wait on a quorum that is already gone."""
        procs = [n.proc for n in self.nodes.values() if n.proc is not None]
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is not None and n.proc.returncode not in (
                    -signal.SIGKILL, 0):
                self._failed = True  # died on its own: keep the logs for a post-mortem
        clean = True
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a SIGSTOPped JVM would sit on SIGTERM
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            clean &= process.terminate(proc, timeout)
        if not clean:
            log.warning("local Kafka cluster: a node did not stop within %.0fs; killed", timeout)
        for n in self.nodes.values():
            n.proc, n.paused = None, False
        self._started = False
        self._admin = None
        self._cleanup()

    def _kill_all(self) -> None:
        for n in self.nodes.values():
            if n.proc is not None:
                process.kill(n.proc)
            n.proc = None

    def _cleanup(self) -> None:
        self._kill_all()
        workspace.release(self._tmpdir, failed=self._failed,
                          keep_on_failure=self.keep_logs_on_failure)
        self._tmpdir = None

    # -- faults ------------------------------------------------------------------------------
    def kill9(self, node_id: int) -> None:
        """SIGKILL one node: no controlled shutdown, its leaderships move only once the
        controller fences it (broker.session.timeout.ms)."""
        node = self.node(node_id)
        if node.proc is None or node.proc.poll() is not None:
            raise LocalKafkaError(f"node {node_id} is not running")
        node.proc.kill()
        node.proc.wait(timeout=30)
        node.paused = False
        log.info("local Kafka cluster: node %d killed (SIGKILL)", node_id)

    def restart(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a stopped or killed node again, same ports and data; returns once the
        cluster lists it as a broker again (it may still be catching up as a follower)."""
        node = self.node(node_id)
        if node.is_running():
            raise LocalKafkaError(f"node {node_id} is still running")
        assert self._libs is not None
        offset = process.file_size(node.log_path)
        node.proc = process.launch_broker(self._libs, node.log4j_file, node.props_file,
                                          node.log_path, heap=self.heap)
        node.paused = False
        try:
            self.wait_brokers({node_id}, timeout)
        except LocalKafkaError:
            self._failed = True
            if b"Address already in use" in process.appended_since(node.log_path, offset):
                raise LocalKafkaError(f"node {node_id} cannot restart: its port was taken "
                                      "while it was down") from None
            raise
        log.info("local Kafka cluster: node %d restarted", node_id)

    def pause(self, node_id: int) -> None:
        """Freeze one node (SIGSTOP): cut off, its sockets open, nothing answers."""
        self._signal(node_id, signal.SIGSTOP)
        self.node(node_id).paused = True

    def resume(self, node_id: int) -> None:
        """Undo pause() (SIGCONT). The node finds itself fenced and catches up."""
        self._signal(node_id, signal.SIGCONT)
        self.node(node_id).paused = False

    def _signal(self, node_id: int, sig: signal.Signals) -> None:
        node = self.node(node_id)
        if node.proc is None or node.proc.poll() is not None:
            raise LocalKafkaError(f"node {node_id} is not running")
        node.proc.send_signal(sig)

    # -- waiting -----------------------------------------------------------------------------
    def _admin_client(self) -> AdminClient:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({
                "bootstrap.servers": self.bootstrap_servers,
                "log_level": 0,  # a killed node's "connection refused" is the point, not noise
                "reconnect.backoff.max.ms": 500,
                "socket.timeout.ms": 5000,
                "metadata.recovery.rebootstrap.trigger.ms": 5000,
            })
        return self._admin

    def _metadata(self, topic: str | None = None, timeout: float = 10.0) -> ClusterMetadata:
        """Cluster metadata from whichever node answers. The shared client may be waiting on
        a frozen node (a paused JVM accepts connections and never answers), so after a short
        try each running, unpaused node is asked on its own."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        errors: list[str] = []
        clients = [self._admin_client()]
        while True:
            for client in clients:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LocalKafkaError(f"cluster metadata unavailable: {errors[-3:]}")
                try:
                    return client.list_topics(topic, timeout=min(3.0, max(0.1, left)))
                except KafkaException as exc:
                    errors.append(str(exc))
            clients = [AdminClient({"bootstrap.servers": n.bootstrap, "log_level": 0,
                                    "socket.timeout.ms": 2000})
                       for n in self.nodes.values() if n.is_running() and not n.paused]
            if not clients:
                raise LocalKafkaError("no running node to ask for metadata")

    def live_brokers(self, timeout: float = 10.0) -> set[int]:
        """The node ids the cluster's metadata lists as brokers (registered, not fenced)."""
        return set(self._metadata(timeout=timeout).brokers)

    def wait_brokers(self, node_ids: set[int], timeout: float) -> None:
        """Until each of ``node_ids`` answers metadata itself and the cluster lists it."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        probes = {i: AdminClient({"bootstrap.servers": self.nodes[i].bootstrap, "log_level": 0,
                                  "reconnect.backoff.max.ms": 200, "socket.timeout.ms": 2000})
                  for i in node_ids}
        pending = set(node_ids)
        while pending and (left := deadline - time.monotonic()) > 0:
            for i in sorted(pending):
                node = self.nodes[i]
                if node.proc is not None and node.proc.poll() is not None:
                    raise LocalKafkaError(
                        f"Kafka node {i} exited early (rc={node.proc.returncode}); log "
                        f"{node.log_path}:\n{process.read_tail(node.log_path)}")
                try:
                    brokers = probes[i].list_topics(timeout=min(1.0, max(0.1, left))).brokers
                except KafkaException:  # _TRANSPORT / _TIMED_OUT while the JVM starts
                    continue
                if i in brokers:
                    pending.discard(i)
            if pending:
                time.sleep(0.2)
        if pending:
            tails = "\n".join(f"--- node {i} ({self.nodes[i].log_path}):\n"
                              f"{process.read_tail(self.nodes[i].log_path, 30)}"
                              for i in sorted(pending))
            raise LocalKafkaError(f"Kafka nodes {sorted(pending)} not live after "
                                  f"{timeout:.0f}s:\n{tails}")

    def under_replicated(self, timeout: float = 10.0) -> dict[str, list[int]]:
        """Partitions (internal topics too) whose in-sync replicas are fewer than their
        replicas, or that have no leader: topic -> partitions."""
        meta = self._metadata(timeout=timeout)
        out: dict[str, list[int]] = {}
        for name, topic in meta.topics.items():
            bad = [p.id for p in topic.partitions.values()
                   if p.leader < 0 or len(p.isrs) < len(p.replicas)]
            if bad:
                out[name] = sorted(bad)
        return out

    def wait_in_sync(self, timeout: float = 120.0) -> None:
        """Until every node is a live broker and every partition is fully replicated again:
        the state a drill starts from (a restarted node catches up after it registers)."""
        deadline = time.monotonic() + timeout
        behind: dict[str, list[int]] = {}
        live: set[int] = set()
        while time.monotonic() < deadline:
            try:
                live = self.live_brokers()
                behind = self.under_replicated()
            except LocalKafkaError:
                time.sleep(0.5)
                continue
            if live == set(self.nodes) and not behind:
                return
            time.sleep(0.5)
        raise LocalKafkaError(f"cluster not in sync after {timeout:.0f}s: live brokers "
                              f"{sorted(live)}, under-replicated {behind}")

    # -- who does what -----------------------------------------------------------------------
    def leader(self, topic: str, partition: int, timeout: float = 10.0) -> int:
        """The node the metadata names as the partition's leader (after a kill, the dead
        node until the controller fences it)."""
        meta = self._metadata(topic, timeout)
        t = meta.topics.get(topic)
        if t is None or t.error is not None or partition not in t.partitions:
            why = t.error if t is not None else "no such topic"
            raise LocalKafkaError(f"no partition {topic}[{partition}]: {why}")
        leader = t.partitions[partition].leader
        if leader < 0:
            raise LocalKafkaError(f"{topic}[{partition}] has no leader right now")
        return int(leader)

    def group_coordinator(self, group: str, timeout: float = 10.0) -> int:
        """The node coordinating consumer group ``group`` (DescribeGroups' answer)."""
        from confluent_kafka import KafkaException

        futures = self._admin_client().describe_consumer_groups([group],
                                                                request_timeout=timeout)
        try:
            desc = futures[group].result(timeout=timeout)
        except KafkaException as exc:
            raise LocalKafkaError(f"describing group {group!r} failed: {exc}") from exc
        if desc.coordinator is None:
            raise LocalKafkaError(f"group {group!r} has no coordinator right now")
        return int(desc.coordinator.id)

    def transaction_coordinator(self, transactional_id: str, timeout: float = 10.0) -> int:
        """The node coordinating ``transactional_id``: the leader of its partition of
        ``__transaction_state``, found the way the broker finds it (confluent-kafka's
        AdminClient has no DescribeTransactions). The topic exists once a transactional
        producer called init_transactions."""
        meta = self._metadata(TRANSACTION_STATE_TOPIC, timeout)
        t = meta.topics.get(TRANSACTION_STATE_TOPIC)
        if t is None or t.error is not None or not t.partitions:
            raise LocalKafkaError(f"no {TRANSACTION_STATE_TOPIC} yet (no transactional "
                                  "producer has started)")
        return self.leader(TRANSACTION_STATE_TOPIC,
                           coordinator_partition(transactional_id, len(t.partitions)), timeout)

    def create_topics(self, names: list[str], partitions: int = 1,
                      config: dict[str, str] | None = None,
                      replication_factor: int | None = None, leader: int | None = None) -> None:
        """Create topics (replicated ``min(3, nodes)`` times unless told) and wait for
        leaders; existing ones are ignored. ``leader``: the node every partition prefers as
        its leader (a drill keeps one role off the node it is about to kill)."""
        from .admin import create_topics  # lazy: imports confluent_kafka

        rf = replication_factor or min(3, self.brokers)
        assignment = None
        if leader is not None:
            others = [i for i in sorted(self.nodes) if i != self.node(leader).node_id]
            assignment = [[leader, *others[:rf - 1]] for _ in range(partitions)]
        create_topics(self.bootstrap_servers, names, partitions, config,
                      replication_factor=rf, replica_assignment=assignment)

    def __del__(self) -> None:
        # Last-resort guard against leaked JVMs when stop() was never called.
        for node in getattr(self, "nodes", {}).values():
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
