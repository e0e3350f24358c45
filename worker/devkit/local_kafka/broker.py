"""LocalKafka: a throwaway single-node KRaft broker for tests and demos."""

from __future__ import annotations

import logging
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import config, process, workspace
from . import security as sec
from .errors import LocalKafkaError
from .jars import DEFAULT_VERSION, ensure_jars
from .oidc import IdentityProvider
from .security import Principal, Protocol, Security

if TYPE_CHECKING:
    from .acls import Acls

log = logging.getLogger(__name__)
BIND_ATTEMPTS = 3  # free_port() is racy; retry with new ports on a bind clash


class LocalKafka(process.Runs):
    """Context manager around a `kafka.Kafka` JVM; nothing happens until start()."""

    def __init__(
        self,
        *,
        version: str = DEFAULT_VERSION,
        workdir: Path | None = None,
        cache_dir: Path | None = None,
        num_partitions: int = 1,
        extra_config: dict[str, str] | None = None,
        extra_listeners: dict[str, tuple[int, int]] | None = None,
        keep_logs_on_failure: bool = True,
        security: Security | None = None,
    ) -> None:
        """``security``: also open SASL_SSL (SCRAM-SHA-512 and/or OAUTHBEARER) and/or mTLS
        listeners with an authorizer (see security.py; OAUTHBEARER starts the devkit's identity
        provider, oidc.py, next to the broker); ``bootstrap_servers`` stays the devkit's own
        PLAINTEXT listener (a super user), ``secure_bootstrap()`` gives the others."""
        self.version = version
        self.cache_dir = cache_dir
        self.num_partitions = num_partitions
        self.extra_config = dict(extra_config or {})
        # name -> (port bound, port advertised): config.server_properties
        self.extra_listeners = dict(extra_listeners or {})
        self.keep_logs_on_failure = keep_logs_on_failure
        self.paused = False
        self._given_workdir = workdir
        self._tmpdir: Path | None = None  # created by us, hence ours to delete
        self._workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._bootstrap: str | None = None
        self._failed = False
        self.security = security
        self._ports: dict[str, int] = {}
        self._certs: sec.Certificates | None = None
        self._broker_store: Path | None = None
        self._acls: Acls | None = None
        self._idp: IdentityProvider | None = None
        self.super_principal: Principal | None = (
            Principal(security.super_user, secrets.token_hex(16)) if security else None)

    @property
    def bootstrap_servers(self) -> str:
        if self._bootstrap is None:
            raise LocalKafkaError("LocalKafka not started")
        return self._bootstrap

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise LocalKafkaError("LocalKafka not started")
        return self._workdir

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 90.0) -> str:
        """Format storage, launch the broker, block until it answers metadata."""
        if self.is_running():
            return self.bootstrap_servers
        if self._proc is not None:  # died since the last start: reap it, release its workdir
            self.stop()
        libs = ensure_jars(self.version, self.cache_dir)
        self._workdir, self._tmpdir = workspace.acquire(self._given_workdir)
        self._failed = False
        deadline = time.monotonic() + timeout
        try:
            if self.security is not None:
                self._make_certificates()
                if self.security.oauthbearer:
                    self._start_identity_provider(libs, deadline)
            for attempt in range(1, BIND_ATTEMPTS + 1):
                offset = process.file_size(self.log_path)
                try:
                    return self._start_once(libs, attempt, max(1.0, deadline - time.monotonic()))
                except LocalKafkaError:
                    self._kill()
                    attempt_log = process.appended_since(self.log_path, offset)
                    if attempt == BIND_ATTEMPTS or b"Address already in use" not in attempt_log:
                        raise
                    log.warning("local Kafka port clash, retrying with new ports")
        except BaseException:
            self._failed = True
            self._cleanup()
            raise
        raise AssertionError("unreachable")

    def _start_once(self, libs: Path, attempt: int, timeout: float) -> str:
        started = time.monotonic()
        extra = self.extra_config
        secured: tuple[str, ...] = ()
        format_args: tuple[str, ...] = ()
        jvm: dict[str, str] = {}
        if self.security is not None:
            assert self._certs is not None and self._broker_store is not None
            extra = {**sec.broker_properties(self.security, self._certs, self._broker_store,
                                             self._idp), **extra}
            secured = self.security.listeners
            if self._idp is not None:
                jvm[sec.ALLOWED_URLS_PROPERTY] = self._idp.jwks_url
            if self.security.sasl_ssl:
                su = self.super_principal
                assert su is not None
                format_args = ("--add-scram",
                               f"{sec.MECHANISM}=[name={su.name},password={su.password}]")
        ports, props, log4j = config.write_attempt_files(
            self.workdir, self.log_path, attempt, self.num_partitions, extra,
            self.extra_listeners, secured)
        process.format_storage(libs, log4j, props, config.random_cluster_id(), self.log_path,
                               format_args)
        self._proc = process.launch_broker(libs, log4j, props, self.log_path,
                                           system_properties=jvm)
        bootstrap = f"127.0.0.1:{ports['PLAINTEXT']}"
        process.wait_ready(self._proc, bootstrap, self.log_path, timeout)
        self._bootstrap = bootstrap
        self._ports = ports
        log.info("local Kafka %s up at %s in %.1fs (pid %s, log %s)", self.version, bootstrap,
                 time.monotonic() - started, self._proc.pid, self.log_path)
        return bootstrap

    def stop(self, timeout: float = 30.0) -> None:
        """Controlled shutdown (SIGTERM), SIGKILL after `timeout`; then remove the temp workdir."""
        if self._proc is not None:
            if self._proc.poll() is not None:
                self._failed = True  # died on its own: keep the log for a post-mortem
            elif not process.terminate(self._proc, timeout):
                self._failed = True
                log.warning("local Kafka did not stop within %.0fs; killed", timeout)
        self._proc = None
        self._bootstrap = None
        self._ports = {}
        self._acls = None
        self.paused = False
        self._cleanup()

    def _kill(self) -> None:
        if self._proc is not None:
            process.kill(self._proc)
        self._proc = None

    def _cleanup(self) -> None:
        self._kill()
        if self._idp is not None:  # it outlives a start attempt, not the broker
            self._idp.stop()
            self._idp = None
        keep = self.keep_logs_on_failure
        workspace.release(self._tmpdir, failed=self._failed, keep_on_failure=keep)
        self._tmpdir = None

    def pause(self) -> None:
        """Freeze the broker JVM (SIGSTOP): connections stay open but nothing answers."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """Undo pause() (SIGCONT). After a long pause the broker may be briefly fenced."""
        self._signal(signal.SIGCONT)
        self.paused = False

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise LocalKafkaError("LocalKafka is not running")
        self._proc.send_signal(sig)

    def create_topics(
        self, names: list[str], partitions: int = 1, config: dict[str, str] | None = None
    ) -> None:
        """Create topics via AdminClient and wait for leaders; existing ones are ignored."""
        from .admin import create_topics  # lazy: imports confluent_kafka

        create_topics(self.bootstrap_servers, names, partitions, config)

    # -- security (LocalKafka(security=Security(...))) ---------------------------------------
    def _make_certificates(self) -> None:
        t = time.monotonic()
        self._certs = sec.Certificates(self.workdir / "tls")
        self._certs.make_ca()
        self._broker_store = self._certs.issue("broker", "localhost", self._certs.password,
                                               san="ip:127.0.0.1,dns:localhost")
        log.info("local Kafka certificates made in %.1fs", time.monotonic() - t)

    def _start_identity_provider(self, libs: Path, deadline: float) -> None:
        assert self._certs is not None and self._broker_store is not None
        # It serves HTTPS with the broker's certificate (127.0.0.1, signed by the devkit's CA):
        # a certificate of its own would cost four more keytool runs at every start.
        self._idp = IdentityProvider(self.workdir / "idp", self._broker_store,
                                     self._certs.password)
        self._idp.start(libs, timeout=max(1.0, deadline - time.monotonic()))

    @property
    def identity_provider(self) -> IdentityProvider:
        """The devkit's OAuth/OIDC identity provider (Security(oauthbearer=True) only)."""
        self._secured()
        if self._idp is None:
            raise LocalKafkaError("LocalKafka has no identity provider (Security(oauthbearer="
                                  "True) starts one)")
        return self._idp

    def _secured(self) -> tuple[Security, sec.Certificates]:
        if self.security is None or self._certs is None or self._bootstrap is None:
            raise LocalKafkaError("LocalKafka not started with security=Security(...)")
        return self.security, self._certs

    @property
    def ca_location(self) -> Path:
        """The CA certificate (PEM) that signed the broker's and the clients' certificates."""
        return self._secured()[1].ca_pem

    def secure_bootstrap(self, protocol: Protocol = "SASL_SSL") -> str:
        """The bootstrap address of ``protocol``'s listener (OAUTHBEARER: the SASL_SSL one)."""
        wanted, _ = self._secured()
        if not wanted.allows(protocol):
            raise LocalKafkaError(f"LocalKafka has no {protocol} login (see Security)")
        return f"127.0.0.1:{self._ports[sec.listener_of(protocol)]}"

    def add_principal(self, name: str) -> Principal:
        """A new identity ``User:<name>`` with no ACL: a SCRAM-SHA-512 user on the SASL_SSL
        listener, an OAuth client (id ``name``) of the identity provider, and a client
        certificate (CN=<name>) for the mTLS one, as the broker has them; one secret for all
        three. Valid until stop()."""
        wanted, certs = self._secured()
        password = secrets.token_hex(16)
        keystore = certs.issue(f"client-{name}", name, password) if wanted.mtls else None
        if wanted.sasl_ssl:
            sec.create_scram_users(self.bootstrap_servers, {name: password})
        if wanted.oauthbearer:
            self.identity_provider.register(name, password)
        return Principal(name, password, keystore)

    def client_settings(self, principal: Principal, protocol: Protocol = "SASL_SSL"
                        ) -> dict[str, Any]:
        """librdkafka settings (bootstrap.servers included) for ``principal`` on ``protocol``'s
        listener; security.sec.java_client_properties() turns them into the Java client's."""
        token_url = self.identity_provider.token_url if protocol == "OAUTHBEARER" else None
        return sec.client_settings(principal, protocol, self.secure_bootstrap(protocol),
                                   self.ca_location, token_url)

    @property
    def acls(self) -> Acls:
        """Grant and revoke ACLs as the super user (see acls.Acls)."""
        self._secured()
        if self._acls is None:
            from .acls import Acls  # lazy: imports confluent_kafka

            self._acls = Acls(self.bootstrap_servers)
        return self._acls

    def __del__(self) -> None:
        # Last-resort guard against a leaked JVM when stop() was never called.
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
