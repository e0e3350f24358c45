"""The devkit's OAuth 2.0 / OIDC identity provider, for LocalKafka(security=Security(
oauthbearer=True)) only: never a production identity provider.

It serves, over HTTPS (the broker's certificate, signed by the devkit's CA), a JWKS document
with an RSA key made at start (``/jwks``, which the broker's OAUTHBEARER validator reads) and a
token endpoint for the client_credentials grant (``/token``, which librdkafka's
``sasl.oauthbearer.method=oidc`` calls): a known client id and secret get an RS256 JWT whose
``sub`` is the client id, so the broker's principal is ``User:<client id>`` and the devkit's ACL
helper applies to it as to a SCRAM user.

The server is IdentityProvider.java, run by the JVM the broker needs anyway: it signs with
jose4j, the JOSE library the broker itself validates with, and serves HTTPS with the JDK's
server. The worker's Python environment has no RSA signer (no ``cryptography``), and a
hand-written one would be untested crypto in a test's trust path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import select
import shutil
import subprocess
import threading
import time
from pathlib import Path

from .config import render_properties
from .errors import LocalKafkaError
from .java import checked_java
from .process import read_tail

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("IdentityProvider.java")
AUDIENCE = "local-kafka"
# A short-lived JVM serving a few requests: C1 only, class-data sharing, a small heap.
_JVM = ["-Xms16m", "-Xmx64m", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
        "-Djava.awt.headless=true"]
# Client ids are keys of a .properties file (and JWT subjects): no character that needs escaping.
_CLIENT_ID = re.compile(r"[A-Za-z0-9._-]+")


class IdentityProvider:
    """The token endpoint and JWKS of LocalKafka's OAUTHBEARER login; start() before the broker
    (whose validator needs the JWKS URL and the JVM property that allows it)."""

    def __init__(self, directory: Path, keystore: Path, keystore_password: str,
                 audience: str = AUDIENCE, token_lifetime_s: int = 3600) -> None:
        self.directory = directory
        self.keystore = keystore
        self._keystore_password = keystore_password
        self.audience = audience
        self.token_lifetime_s = token_lifetime_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._lock = threading.Lock()

    @property
    def clients_file(self) -> Path:
        return self.directory / "idp-clients.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "idp.log"

    @property
    def issuer(self) -> str:
        if self._port is None:
            raise LocalKafkaError("identity provider not started")
        return f"https://127.0.0.1:{self._port}"

    @property
    def token_url(self) -> str:
        return f"{self.issuer}/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/jwks"

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, libs: Path, timeout: float = 60.0) -> str:
        """Launch the server (on a free port of 127.0.0.1) and wait until it listens; the issuer
        URL."""
        if self.is_running():
            return self.issuer
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.clients_file.exists():
            self._write_clients({})
        cmd = [checked_java(), *_JVM, "-cp", f"{libs}/*", str(SOURCE)]
        setpriv = shutil.which("setpriv")
        if setpriv:  # as for the broker: no orphan JVM if this process dies without stop()
            cmd = [setpriv, "--pdeathsig", "TERM", "--", *cmd]
        settings = render_properties({
            "keystore": str(self.keystore), "keystore.password": self._keystore_password,
            "clients": str(self.clients_file), "audience": self.audience,
            "token.lifetime.s": str(self.token_lifetime_s)})
        with open(self.log_path, "ab") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err)
        self._proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(settings.encode())
        proc.stdin.close()
        line = self._first_line(proc, timeout)
        match = re.fullmatch(r"port=(\d+)", line.strip())
        if not match:
            self.stop()
            raise LocalKafkaError(f"identity provider said {line!r}, not its port; log "
                                  f"{self.log_path}:\n{read_tail(self.log_path)}")
        self._port = int(match.group(1))
        log.info("local identity provider up at %s (pid %s)", self.issuer, proc.pid)
        return self.issuer

    def _first_line(self, proc: subprocess.Popen[bytes], timeout: float) -> str:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
            if ready:
                # It prints one line once listening and nothing more on stdout, so this
                # neither blocks nor leaves a pipe for it to fill later.
                return proc.stdout.readline().decode(errors="replace")
            if proc.poll() is not None:
                break
        rc = proc.poll()
        self.stop()
        why = f"exited (rc={rc})" if rc is not None else f"not listening after {timeout:.0f}s"
        raise LocalKafkaError(f"identity provider {why}; log {self.log_path}:\n"
                              f"{read_tail(self.log_path)}")

    def register(self, client_id: str, secret: str) -> None:
        """Let ``client_id`` get tokens with ``secret`` (at once, also while it runs). The file
        keeps the secret's SHA-256 only."""
        if not _CLIENT_ID.fullmatch(client_id):
            raise LocalKafkaError(f"client id {client_id!r}: letters, digits, '.', '_' and '-' "
                                  "only (it is a key of the identity provider's client file)")
        with self._lock:
            clients = self._read_clients()
            clients[client_id] = hashlib.sha256(secret.encode()).hexdigest()
            self._write_clients(clients)

    def _read_clients(self) -> dict[str, str]:
        lines = self.clients_file.read_text().splitlines() if self.clients_file.exists() else []
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def _write_clients(self, clients: dict[str, str]) -> None:
        # Replaced in one rename: the server reads the file at each token request and must
        # never see half of it.
        tmp = self.clients_file.with_suffix(".tmp")
        tmp.write_text(render_properties(clients))
        os.replace(tmp, self.clients_file)

    def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc, self._port = self._proc, None, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()

    def __del__(self) -> None:
        # Last-resort guard against a leaked JVM when stop() was never called.
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
