"""What a process presents and trusts on gRPC: one `Credentials` type for servers, agents and clients.

- TLS: `ca_pem` (whom to trust), and `cert_pem` + `key_pem` (who we are; mutual TLS). A server
  needs all three and requires its callers' certificates. A client without a certificate still
  verifies the server (server-auth TLS); without `ca_pem` it trusts the system's roots.
- `token`: a bearer token sent on every call (`authorization: Bearer ...`): a join token for
  agents, a client or admin token for callers; over plaintext only with `insecure`.
- `server_name` (set by `for_peer`): the name the server's certificate must carry, instead of the
  dialed host: how an agent makes sure the peer at an endpoint is the worker a ticket names.
- `insecure`: plaintext. Never a default: a server runs plaintext only with an explicit --insecure
  (and says so in its log), a client only when told or when the local cluster it talks to is.

`resolve_client(endpoint, explicit)` is where the SDK and CLI find theirs: the explicit ones, else
$KVPLANE_TLS_CA / $KVPLANE_TLS_CERT / $KVPLANE_TLS_KEY / $KVPLANE_TOKEN / $KVPLANE_INSECURE, else
the credentials directory that `kvplane up` (a LocalCluster) wrote for that endpoint, else TLS
against the system roots with no client certificate.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

from kvplane.security import reload
from kvplane.security.identity import Identity
from kvplane.security.reload import CertificateFiles

ENV_CA, ENV_CERT, ENV_KEY = "KVPLANE_TLS_CA", "KVPLANE_TLS_CERT", "KVPLANE_TLS_KEY"
ENV_TOKEN, ENV_INSECURE = "KVPLANE_TOKEN", "KVPLANE_INSECURE"
ENV_HOME = "KVPLANE_HOME"  # where local clusters keep their credentials (default ~/.kvplane)
# Files of a local cluster's credentials directory (kvplane.security.local writes them).
CA_FILE, CLIENT_STEM, TOKEN_FILE, INSECURE_MARKER = "ca.pem", "client", "token", "insecure"


class CredentialsError(ValueError):
    """Credentials are incomplete, unreadable or contradictory; the message says what to pass."""


@dataclass(frozen=True, slots=True)
class Credentials:
    ca_pem: bytes | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str = ""
    insecure: bool = False
    source: str = "explicit"  # where they came from, for error messages
    server_name: str = ""  # the name the server's certificate must carry ("" = the host dialed)
    # The files they were read from, re-read when they change (kvplane.security.reload); None = fixed.
    files: CertificateFiles | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.cert_pem is None) != (self.key_pem is None):
            raise CredentialsError("a TLS certificate needs its private key and the other way round (--tls-cert with --tls-key)")
        if self.insecure and (self.ca_pem or self.cert_pem):
            raise CredentialsError("--insecure (plaintext) cannot be combined with TLS files")
        if any(c in self.token for c in "\r\n\x00"):
            raise CredentialsError("a token cannot contain line breaks or NUL")

    # -- constructors -----------------------------------------------------------------------------

    @classmethod
    def from_files(
        cls, cert: str | os.PathLike | None = None, key: str | os.PathLike | None = None, ca: str | os.PathLike | None = None,
        *, token: str = "", source: str = "explicit",
    ) -> Credentials:  # fmt: skip
        made = cls(_read(ca, "CA"), _read(cert, "certificate"), _read(key, "key"), token=token, source=source)
        return replace(made, files=_watch(cert, key, ca))

    @classmethod
    def plaintext(cls, token: str = "", source: str = "explicit") -> Credentials:
        return cls(token=token, insecure=True, source=source)

    def with_token(self, token: str) -> Credentials:
        return replace(self, token=token)

    def for_peer(self, peer: Identity) -> Credentials:
        """These credentials for calling the server `peer` only: the TLS handshake fails unless its
        certificate names peer.server_name() in a DNS SAN and allows serverAuth, which a client's
        or another worker's does not. (gRPC in Python checks DNS SANs against the name dialed, never
        the URI SAN, so that name stands for the SPIFFE ID; kvplane.security.identity.) Plaintext
        credentials are returned as they are: there is no certificate to check."""
        return self if self.insecure else replace(self, server_name=peer.server_name())

    # -- what they are ----------------------------------------------------------------------------

    @property
    def tls(self) -> bool:
        return not self.insecure

    @property
    def mutual(self) -> bool:
        return self.cert_pem is not None

    def identity(self) -> Identity | None:
        """The identity in our certificate, or None without one."""
        if self.cert_pem is None:
            return None
        from kvplane.security.certs import identity_of  # noqa: PLC0415 (cryptography loads only when needed)

        return identity_of(self.cert_pem)

    # -- gRPC objects -----------------------------------------------------------------------------

    def server_credentials(self) -> grpc.ServerCredentials:
        """mTLS server credentials: callers must present a certificate our CA signed."""
        if self.insecure:
            raise CredentialsError("plaintext credentials have no server credentials")
        if self.cert_pem is None or self.ca_pem is None:
            raise CredentialsError(
                "a TLS server needs --tls-cert, --tls-key and --tls-ca (make them with `kvplane certs`), or --insecure for plaintext"
            )
        if self.files is not None:
            return reload.server_credentials(self.files)
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem, require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        if self.insecure:
            raise CredentialsError("plaintext credentials have no channel credentials")
        if self.files is not None:
            m = self.files.current()
            return grpc.ssl_channel_credentials(m.ca_pem, m.key_pem, m.cert_pem)
        return grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        """Channel options these credentials need: the server name to verify, when one is set."""
        return (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else ()

    def describe(self) -> str:
        if self.insecure:
            return f"plaintext{' with a bearer token' if self.token else ''} ({self.source})"
        who = "mutual TLS" if self.mutual else "TLS without a client certificate"
        trust = "" if self.ca_pem else ", trusting the system's CAs"
        return f"{who}{trust}{' with a bearer token' if self.token else ''} ({self.source})"


def _watch(cert, key, ca) -> CertificateFiles | None:
    """Files to reload from when all three are given and make a whole set now (else gRPC's own
    error at first use says what is wrong, as without reloading). Without the `cryptography`
    package (the SDK's base install) the files are read once, as when they were given as bytes:
    a rotation could not be checked whole before it is used."""
    if not (cert and key and ca) or importlib.util.find_spec("cryptography") is None:
        return None
    try:
        return reload.CertificateFiles(cert, key, ca)
    except (OSError, ValueError):
        return None


def _read(path: str | os.PathLike | None, what: str) -> bytes | None:
    if path is None or path == "":
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise CredentialsError(f"cannot read the TLS {what} file {path}: {e.strerror or e}") from None


# -- where clients find theirs ----------------------------------------------------------------------


def kvplane_home() -> Path:
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".kvplane")


def cluster_dir(endpoint: str) -> Path:
    """The credentials directory a local cluster serving `endpoint` writes."""
    return kvplane_home() / "clusters" / endpoint.replace(":", "_").replace("/", "_").replace("[", "").replace("]", "")


def _aliases(endpoint: str) -> list[str]:
    host, _, port = endpoint.rpartition(":")
    same = {"localhost", "127.0.0.1", "[::1]", "::1"}
    if host in same:
        return [endpoint, *(f"{h}:{port}" for h in ("127.0.0.1", "localhost") if h != host)]
    return [endpoint]


def from_cluster_dir(directory: Path) -> Credentials | None:
    """The client credentials a local cluster left in `directory`, or None when there are none."""
    token_path = directory / TOKEN_FILE
    token = token_path.read_text().strip() if token_path.exists() else ""
    source = f"local cluster credentials in {directory}"
    if (directory / INSECURE_MARKER).exists():
        return Credentials.plaintext(token, source=source)
    if (directory / CA_FILE).exists():
        return Credentials.from_files(
            directory / f"{CLIENT_STEM}.pem", directory / f"{CLIENT_STEM}.key", directory / CA_FILE, token=token, source=source
        )
    return None


def from_environment() -> Credentials | None:
    env = os.environ
    token = env.get(ENV_TOKEN, "")
    if env.get(ENV_INSECURE, "").lower() in ("1", "true", "yes"):
        return Credentials.plaintext(token, source=f"${ENV_INSECURE}")
    if any(env.get(k) for k in (ENV_CA, ENV_CERT, ENV_KEY)):
        return Credentials.from_files(env.get(ENV_CERT), env.get(ENV_KEY), env.get(ENV_CA), token=token, source="$KVPLANE_TLS_*")
    if token:
        return Credentials(token=token, source=f"${ENV_TOKEN}")
    return None


def resolve_client(endpoint: str, explicit: Credentials | None = None) -> Credentials:
    """The credentials a client uses for `endpoint` (see the module docstring for the order). A
    comma-separated list of replicas ("a:1,b:2") is one cluster with one CA: the first replica that
    has a credentials directory on this machine gives them for all."""
    if explicit is not None:
        return explicit
    found = from_environment()
    if found is not None:
        return found
    for replica in (e.strip() for e in endpoint.split(",")):
        for alias in _aliases(replica):
            found = from_cluster_dir(cluster_dir(alias))
            if found is not None:
                return found
    return Credentials(source=f"defaults: no credentials found for {endpoint} in $KVPLANE_TLS_*, $KVPLANE_TOKEN or {cluster_dir(endpoint)}")
