"""A client in another language, written from the contract alone (schemas/clients/java): it
sends contract v2 jobs, reads results and DLQ records with read_committed from an exactly-once
worker, finds each answer on the partition Java's default partitioner picks for its key, and
each result in v2's one shape."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.workers import ThreadedWorker, Topics, worker_config
from worker.bundled import samples_dir
from worker.devkit.local_kafka import LocalKafka, jar_cache_root
from worker.devkit.local_kafka.admin import create_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]
CLIENT = REPO / "schemas" / "clients" / "java"


def _client_libs() -> Path:
    """kafka-clients and msgpack-core from Maven Central (cached like the broker's jars)."""
    out = jar_cache_root() / "java-client-libs"
    if not (out / ".complete").is_file():
        subprocess.run(["mvn", "-B", "-q", "-f", str(CLIENT / "pom.xml"),
                        "dependency:copy-dependencies", f"-DoutputDirectory={out}"],
                       check=True, timeout=600)
        (out / ".complete").write_text("ok")
    return out


@pytest.mark.skipif(shutil.which("java") is None or shutil.which("mvn") is None,
                    reason="needs java and mvn (the local broker needs them too)")
def test_the_java_client_is_answered_on_the_partitions_java_expects(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    import uuid

    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}", f"group-{tag}")
    create_topics(kafka_bootstrap, [topics.jobs], partitions=2)
    create_topics(kafka_bootstrap, [topics.results], partitions=3)
    create_topics(kafka_bootstrap, [topics.dlq], partitions=2)
    cfg = worker_config(kafka_bootstrap, topics, processing={"guarantee": "exactly-once"})
    libs = _client_libs()
    image = samples_dir() / "astronaut.jpg"
    with ThreadedWorker(cfg):
        run = subprocess.run(
            ["java", "-cp", f"{libs}/*", str(CLIENT / "JobClient.java"), kafka_bootstrap,
             topics.jobs, topics.results, topics.dlq, str(image), "6", "2", "120"],
            capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {"sent": 8, "answered": 8, "statuses": {"ok": 6},
                   "reasons": {"not_msgpack": 2}, "schemas": {"moderation-result/v2": 6},
                   "misplaced": 0, "not_v2": 0}, got


@pytest.mark.skipif(shutil.which("java") is None or shutil.which("mvn") is None,
                    reason="needs java and mvn (the local broker needs them too)")
def test_the_java_client_over_sasl_ssl_as_a_least_privilege_principal(
        secured_kafka: LocalKafka, tmp_path: Path) -> None:
    """The same client and checks over SASL_SSL (SCRAM-SHA-512, the broker's CA as a PEM
    truststore), the client and the exactly-once worker each a principal holding only its
    own grants."""
    import uuid

    from tests.integration.tools.secured_support import secured_worker_config
    from worker.devkit.local_kafka.security import java_client_properties

    admin = secured_kafka.bootstrap_servers  # the devkit's super-user listener
    tag = uuid.uuid4().hex[:8]
    topics = Topics(f"jobs-{tag}", f"results-{tag}", f"dlq-{tag}", f"group-{tag}")
    create_topics(admin, [topics.jobs, topics.dlq], partitions=2)
    create_topics(admin, [topics.results], partitions=3)
    cfg, _ = secured_worker_config(secured_kafka, topics, exactly_once=True)
    client = secured_kafka.add_principal(f"java-{tag}")
    acls = secured_kafka.acls
    acls.grant(acls.bindings(client.principal, write=[topics.jobs],
                             read=[topics.results, topics.dlq], idempotent_write=True))
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    # Its consumer's group is "java-<hex>", a new one per run: READ on that prefix.
    acls.grant([AclBinding(ResourceType.GROUP, "java-", ResourcePatternType.PREFIXED,
                           client.principal, "*", AclOperation.READ,
                           AclPermissionType.ALLOW)])
    props = java_client_properties(secured_kafka.client_settings(client, "SASL_SSL"))
    props_file = tmp_path / "client.properties"
    props_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()
                                  if k != "bootstrap.servers"))
    libs = _client_libs()
    image = samples_dir() / "astronaut.jpg"
    with ThreadedWorker(cfg):
        run = subprocess.run(
            ["java", "-cp", f"{libs}/*", str(CLIENT / "JobClient.java"),
             props["bootstrap.servers"], topics.jobs, topics.results, topics.dlq, str(image),
             "4", "1", "120"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "JOB_CLIENT_PROPERTIES": str(props_file)})
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {"sent": 5, "answered": 5, "statuses": {"ok": 4},
                   "reasons": {"not_msgpack": 1}, "schemas": {"moderation-result/v2": 4},
                   "misplaced": 0, "not_v2": 0}, got
