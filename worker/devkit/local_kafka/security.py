"""Secured listeners for LocalKafka: SASL_SSL with SCRAM-SHA-512 and/or OAUTHBEARER (OIDC),
and mutual TLS.

Certificates are made at start with the JDK's ``keytool`` (the broker needs a JDK anyway, so
nothing else is required): a throwaway CA, a broker certificate whose SAN holds 127.0.0.1 and
localhost (librdkafka checks the host name by default), and one client certificate per mTLS
principal, each in a PKCS#12 store that librdkafka (``ssl.keystore.location``) and the Java
client both read. keytool cannot write a private key as PEM, hence PKCS#12 for client keys.

The broker keeps a PLAINTEXT listener on 127.0.0.1 for the devkit itself: its principal
(``User:ANONYMOUS``) is a super user, as the broker's own requests on the controller and
inter-broker listeners must be, so topic creation and ACL changes need no credentials.

OAUTHBEARER tokens come from the devkit's own identity provider (oidc.py), for tests only.
"""

from __future__ import annotations

import logging
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .errors import LocalKafkaError, tail
from .java import java_executable

if TYPE_CHECKING:
    from .oidc import IdentityProvider

log = logging.getLogger(__name__)

MECHANISM = "SCRAM-SHA-512"
OAUTHBEARER = "OAUTHBEARER"
SASL_LISTENER = "SASL_SSL"
SSL_LISTENER = "SSL"
# keytool is a short JVM run; C1 only and class-data sharing halve its start-up.
_KEYTOOL_JVM = ["-J-XX:TieredStopAtLevel=1", "-J-Xshare:auto"]
_VALIDITY_DAYS = "7"
# How a client comes in: SASL_SSL (SCRAM-SHA-512), SSL (mTLS), OAUTHBEARER (the SASL_SSL
# listener with an OIDC token from the devkit's identity provider).
Protocol = Literal["SASL_SSL", "SSL", "OAUTHBEARER"]
# The broker's validator fetches JWKS only from URLs listed in this JVM system property
# (Kafka 4.x allows none by default).
ALLOWED_URLS_PROPERTY = "org.apache.kafka.sasl.oauthbearer.allowed.urls"
_VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
_BROKER_VALIDATOR = "org.apache.kafka.common.security.oauthbearer.BrokerJwtValidator"
_OAUTH_LOGIN = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


@dataclass(frozen=True)
class Security:
    """What LocalKafka(security=...) turns on besides its PLAINTEXT listener.

    ``sasl_ssl``: a SASL_SSL listener (SCRAM-SHA-512). ``oauthbearer``: OAUTHBEARER on that
    listener, tokens from the devkit's identity provider (oidc.py), the principal the token's
    ``sub`` (the client id). ``mtls``: an SSL listener that requires a client certificate; the
    principal is the certificate's CN. All authorize with
    StandardAuthorizer and ``allow.everyone.if.no.acl.found=false``: a principal may do only
    what an ACL grants. ``super_user`` has a SCRAM credential from the start (and may do
    anything on either listener).
    """

    sasl_ssl: bool = True
    mtls: bool = False
    super_user: str = "devkit-admin"
    oauthbearer: bool = False

    def __post_init__(self) -> None:
        if not (self.sasl_ssl or self.mtls or self.oauthbearer):
            raise LocalKafkaError(
                "Security() with none of sasl_ssl, mtls, oauthbearer secures nothing")

    @property
    def listeners(self) -> tuple[str, ...]:
        """The secured listeners it opens (OAUTHBEARER is a mechanism of SASL_SSL's)."""
        return tuple(name for name, on in ((SASL_LISTENER, self.sasl_ssl or self.oauthbearer),
                                           (SSL_LISTENER, self.mtls)) if on)

    def allows(self, protocol: Protocol) -> bool:
        return {"SASL_SSL": self.sasl_ssl, "SSL": self.mtls,
                "OAUTHBEARER": self.oauthbearer}[protocol]


def listener_of(protocol: Protocol) -> str:
    return SSL_LISTENER if protocol == "SSL" else SASL_LISTENER


@dataclass(frozen=True)
class Principal:
    """A client identity on the secured broker: ``User:<name>`` on every listener (for
    OAUTHBEARER ``name`` is its OAuth client id)."""

    name: str
    # SCRAM password, that of its PKCS#12 store, and its OAuth client secret
    password: str = field(repr=False)
    keystore: Path | None = None  # its client certificate and key (mTLS only)

    @property
    def principal(self) -> str:
        return f"User:{self.name}"


def _keytool() -> str:
    # keytool sits next to java in every JDK/JRE layout.
    java = Path(java_executable())
    tool = java.resolve().with_name("keytool")
    if not tool.exists():
        raise LocalKafkaError(f"keytool not found next to {java}: the secured broker needs it")
    return str(tool)


def _run_keytool(*args: str, stdin: str | None = None) -> str:
    cmd = [_keytool(), *_KEYTOOL_JVM, *args]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120,
                          check=False)
    if proc.returncode != 0:
        raise LocalKafkaError(
            f"keytool {args[0]} failed (rc={proc.returncode}):\n{tail(proc.stdout + proc.stderr)}")
    return proc.stdout


@dataclass
class Certificates:
    """A CA in ``directory`` and the certificates it signs (all PKCS#12, one password each)."""

    directory: Path
    password: str = field(default_factory=lambda: secrets.token_hex(12))

    @property
    def ca_pem(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def _ca_store(self) -> Path:
        return self.directory / "ca.p12"

    def make_ca(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        _run_keytool("-genkeypair", "-alias", "ca", "-keyalg", "EC", "-groupname", "secp256r1",
                     "-dname", "CN=local-kafka-ca", "-ext", "bc:c", "-validity", _VALIDITY_DAYS,
                     "-keystore", str(self._ca_store), "-storetype", "PKCS12",
                     "-storepass", self.password)
        self.ca_pem.write_text(_run_keytool("-exportcert", "-rfc", "-alias", "ca", "-keystore",
                                            str(self._ca_store), "-storepass", self.password))

    def issue(self, name: str, cn: str, password: str, san: str | None = None) -> Path:
        """A key pair signed by the CA, with its chain, in ``<name>.p12`` under ``password``."""
        store = self.directory / f"{name}.p12"
        store.unlink(missing_ok=True)
        _run_keytool("-genkeypair", "-alias", name, "-keyalg", "EC", "-groupname", "secp256r1",
                     "-dname", f"CN={cn}", "-validity", _VALIDITY_DAYS, "-keystore", str(store),
                     "-storetype", "PKCS12", "-storepass", password)
        request = _run_keytool("-certreq", "-alias", name, "-keystore", str(store),
                               "-storepass", password)
        ext = ["-ext", f"SAN={san}"] if san else []
        signed = _run_keytool("-gencert", "-alias", "ca", "-keystore", str(self._ca_store),
                              "-storepass", self.password, "-rfc", "-validity", _VALIDITY_DAYS,
                              *ext, stdin=request)
        chain = self.directory / f"{name}.chain.pem"
        chain.write_text(signed + self.ca_pem.read_text())
        _run_keytool("-importcert", "-alias", name, "-keystore", str(store), "-storepass",
                     password, "-file", str(chain), "-noprompt")
        return store


def broker_properties(sec: Security, certs: Certificates, broker_store: Path,
                      idp: IdentityProvider | None = None) -> dict[str, str]:
    """The settings of the secured listeners (their addresses are added by config); ``idp``
    (started) for ``sec.oauthbearer``."""
    props = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:ANONYMOUS;User:{sec.super_user}",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(broker_store),
        "ssl.keystore.password": certs.password,
        "ssl.key.password": certs.password,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca_pem),
        # A certificate's principal is its CN ("User:alice"), as a SCRAM user's is its name.
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]*).*$/$1/,DEFAULT",
    }
    sasl = f"listener.name.{SASL_LISTENER.lower()}"
    if sec.sasl_ssl:
        props[f"{sasl}.{MECHANISM.lower()}.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;")
    if sec.oauthbearer:
        if idp is None:
            raise LocalKafkaError("Security(oauthbearer=True) needs the identity provider")
        oauth = f"{sasl}.{OAUTHBEARER.lower()}"
        # The ssl.* JAAS options are the validator's TLS settings for fetching the JWKS over
        # HTTPS. The listener also logs the broker in, with the unsecured login handler (the
        # default), which refuses to start without a subject; that token is never used, as
        # brokers talk to each other over PLAINTEXT.
        props[f"{oauth}.sasl.jaas.config"] = (
            f'{_OAUTH_LOGIN} required unsecuredLoginStringClaim_sub="{sec.super_user}" '
            f'ssl.truststore.type="PEM" ssl.truststore.location="{certs.ca_pem}";')
        props[f"{oauth}.sasl.server.callback.handler.class"] = _VALIDATOR
        props.update({
            # Named, not left to the default: Kafka 4.1's default (DefaultJwtValidator, built
            # without a key resolver by the callback handler) delegates to the client's
            # validator, which checks the claims but not the signature, so a token whose
            # claims were changed after signing got in (test_local_kafka_secured).
            "sasl.oauthbearer.jwt.validator.class": _BROKER_VALIDATOR,
            "sasl.oauthbearer.jwks.endpoint.url": idp.jwks_url,
            "sasl.oauthbearer.expected.issuer": idp.issuer,
            "sasl.oauthbearer.expected.audience": idp.audience,
            "sasl.oauthbearer.sub.claim.name": "sub"})
    mechanisms = [m for m, on in ((MECHANISM, sec.sasl_ssl), (OAUTHBEARER, sec.oauthbearer))
                  if on]
    if mechanisms:
        props["sasl.enabled.mechanisms"] = ",".join(mechanisms)
    if sec.mtls:
        props[f"listener.name.{SSL_LISTENER.lower()}.ssl.client.auth"] = "required"
    return props


def client_settings(principal: Principal, protocol: Protocol, bootstrap: str, ca_pem: Path,
                    token_url: str | None = None) -> dict[str, Any]:
    """librdkafka settings for ``principal`` on the SASL_SSL or the mTLS listener, or with an
    OIDC token (``token_url``: the identity provider's token endpoint) on the SASL_SSL one."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap,
                            "security.protocol": listener_of(protocol),
                            "ssl.ca.location": str(ca_pem)}
    if protocol == "OAUTHBEARER":
        if token_url is None:
            raise LocalKafkaError("OAUTHBEARER needs the identity provider's token URL")
        # librdkafka fetches and refreshes the token itself with method=oidc (client_credentials
        # grant); the default method expects the application to supply tokens.
        conf.update({"sasl.mechanism": OAUTHBEARER, "sasl.oauthbearer.method": "oidc",
                     "sasl.oauthbearer.client.id": principal.name,
                     "sasl.oauthbearer.client.secret": principal.password,
                     "sasl.oauthbearer.token.endpoint.url": token_url,
                     # the token endpoint's certificate is checked against this, not ssl.*
                     "https.ca.location": str(ca_pem)})
    elif protocol == "SASL_SSL":
        conf.update({"sasl.mechanism": MECHANISM, "sasl.username": principal.name,
                     "sasl.password": principal.password})
    else:
        if principal.keystore is None:
            raise LocalKafkaError(f"{principal.principal} has no client certificate (mTLS off)")
        conf.update({"ssl.keystore.location": str(principal.keystore),
                     "ssl.keystore.password": principal.password})
    return conf


def worker_kafka_section(settings: dict[str, Any]) -> dict[str, Any]:
    """The worker's ``[kafka]`` settings for :func:`client_settings`' dict (a client
    certificate goes through ``kafka.extra``: the worker has no setting of its own for it)."""
    section: dict[str, Any] = {"bootstrap_servers": settings["bootstrap.servers"],
                               "security_protocol": settings["security.protocol"],
                               "ssl_ca_location": settings["ssl.ca.location"]}
    if "sasl.username" in settings:
        section.update({"sasl_mechanism": settings["sasl.mechanism"],
                        "sasl_username": settings["sasl.username"],
                        "sasl_password": settings["sasl.password"]})
    if "ssl.keystore.location" in settings:
        section["extra"] = {k: settings[k]
                            for k in ("ssl.keystore.location", "ssl.keystore.password")}
    if settings.get("sasl.mechanism") == OAUTHBEARER:
        section["sasl_mechanism"] = OAUTHBEARER
        section["extra"] = {k: v for k, v in settings.items()
                            if k.startswith(("sasl.oauthbearer.", "https."))}
    return section


def java_client_properties(settings: dict[str, Any]) -> dict[str, str]:
    """The Java client's equivalent of :func:`client_settings`' librdkafka dict (SCRAM or
    mTLS)."""
    if settings.get("sasl.mechanism") == OAUTHBEARER:
        # Not built: the Java client's OIDC login also needs jose4j on its class path and the
        # token URL in a JVM system property (ALLOWED_URLS_PROPERTY), which a properties file
        # cannot carry; nothing here would test it.
        raise LocalKafkaError("java_client_properties: OAUTHBEARER is not supported")
    props = {"bootstrap.servers": str(settings["bootstrap.servers"]),
             "security.protocol": str(settings["security.protocol"]),
             "ssl.truststore.type": "PEM",
             "ssl.truststore.location": str(settings["ssl.ca.location"])}
    if "sasl.username" in settings:
        props["sasl.mechanism"] = MECHANISM
        props["sasl.jaas.config"] = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{settings["sasl.username"]}" password="{settings["sasl.password"]}";')
    if "ssl.keystore.location" in settings:
        props.update({"ssl.keystore.type": "PKCS12",
                      "ssl.keystore.location": str(settings["ssl.keystore.location"]),
                      "ssl.keystore.password": str(settings["ssl.keystore.password"])})
    return props


def create_scram_users(bootstrap: str, users: dict[str, str], timeout: float = 30.0) -> None:
    """SCRAM-SHA-512 credentials for ``users`` (name -> password), as the PLAINTEXT super
    user; returns once the broker authenticates with them (it applies the change from its
    metadata log a moment after the controller committed it)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    upserts: list[Any] = [UserScramCredentialUpsertion(name, info, password.encode())
               for name, password in users.items()]
    for name, fut in admin.alter_user_scram_credentials(upserts,
                                                        request_timeout=timeout).items():
        try:
            fut.result(timeout)
        except KafkaException as exc:
            raise LocalKafkaError(f"creating SCRAM user {name!r} failed: {exc}") from exc
    # The broker answers DescribeUserScramCredentials from the metadata image its
    # authenticator reads too: once it lists a user, that user can log in.
    deadline = time.monotonic() + timeout
    while True:
        futures = admin.describe_user_scram_credentials(list(users), request_timeout=timeout)
        assert isinstance(futures, dict)  # one future per user when users are named
        try:
            for fut in futures.values():
                fut.result(timeout)
            return
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise LocalKafkaError(f"SCRAM users {sorted(users)} not visible: {exc}") from exc
            time.sleep(0.05)
