"""Throw-away credentials for a cluster on one machine (`kvplane up`, `make demo`, tests).

`LocalCredentials.create(directory)` makes a CA and certificates for the control plane, each
worker (named by its worker id) and a local admin, all for localhost. `publish(endpoint)` writes the
client's files (CA, admin certificate and key) into the credentials directory for that endpoint
(kvplane.security.credentials.cluster_dir), where the SDK and CLI on this machine find them with
no flag. `LocalCredentials.plaintext(...)` is the `--insecure` variant: random join and admin
tokens instead of certificates, and an `insecure` marker so clients know to speak plaintext.
Everything is removed again by `remove()`.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kvplane.security import certs
from kvplane.security.credentials import CA_FILE, CLIENT_STEM, INSECURE_MARKER, TOKEN_FILE, Credentials, cluster_dir
from kvplane.security.identity import Identity, Role

LOCAL_ADMIN = Identity(Role.ADMIN, "local-admin")
CONTROLPLANE = Identity(Role.CONTROLPLANE, "controlplane")
CA_STEM = "ca"


@dataclass(slots=True)
class LocalCredentials:
    directory: Path
    insecure: bool = False
    join_token: str = ""  # plaintext clusters: what agents present to register
    admin_token: str = ""  # plaintext clusters: what the local admin presents
    http_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))  # a client of tenant "local" (the HTTP API)
    _ca: certs.KeyPair | None = None
    _published: list[Path] = field(default_factory=list)

    @classmethod
    def create(cls, directory: Path) -> LocalCredentials:
        made = cls(Path(directory), _ca=certs.create_ca("kvplane local CA"))
        certs.write_pair(made.directory, CA_STEM, made._ca)
        made._write(CONTROLPLANE, CONTROLPLANE.name)
        made._write(LOCAL_ADMIN, CLIENT_STEM)
        return made

    @classmethod
    def plaintext(cls, directory: Path) -> LocalCredentials:
        made = cls(Path(directory), insecure=True, join_token=secrets.token_urlsafe(24), admin_token=secrets.token_urlsafe(24))
        made.directory.mkdir(parents=True, exist_ok=True)
        return made

    # -- files for the servers ------------------------------------------------------------------

    @property
    def ca_path(self) -> Path:
        return self.directory / f"{CA_STEM}.pem"

    def _write(self, identity: Identity, stem: str) -> tuple[Path, Path]:
        assert self._ca is not None
        return certs.write_pair(self.directory, stem, certs.issue(self._ca, identity))

    def server_args(self, identity: Identity) -> list[str]:
        """The command-line flags a server process with `identity` needs (issues its certificate)."""
        if self.insecure:
            return ["--insecure"]
        stem = identity.name if identity.role is not Role.CLIENT else f"{identity.tenant}.{identity.name}"
        cert, key = self.directory / f"{stem}.pem", self.directory / f"{stem}.key"
        if not cert.exists():
            cert, key = self._write(identity, stem)
        return ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(self.ca_path)]

    def controlplane_args(self) -> list[str]:
        tokens = self.directory / "tokens.csv"
        if not tokens.exists():
            fd = os.open(tokens, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"{self.http_token},client,http,local\n")
        return [*self.server_args(CONTROLPLANE), "--tokens-file", str(tokens)]

    def worker_args(self, worker_id: str) -> list[str]:
        return self.server_args(Identity(Role.WORKER, worker_id))

    def workers_args(self, worker_ids: list[str]) -> list[str]:
        """The flags of one process running several agents (`kvplane agent --count`): a
        certificate per worker id, named by the `{worker_id}` field of --tls-cert/--tls-key."""
        for worker_id in worker_ids:
            self.worker_args(worker_id)  # issues its certificate
        if self.insecure:
            return ["--insecure"]
        stem = "{worker_id}"
        return ["--tls-cert", str(self.directory / f"{stem}.pem"), "--tls-key", str(self.directory / f"{stem}.key"),
                "--tls-ca", str(self.ca_path)]  # fmt: skip

    def env(self) -> dict[str, str]:
        """Environment for the children: the tokens of a plaintext cluster (kept out of argv, which `ps` shows)."""
        if not self.insecure:
            return {}
        return {"KVPLANE_JOIN_TOKEN": self.join_token, "KVPLANE_ADMIN_TOKEN": self.admin_token}

    # -- what clients use ---------------------------------------------------------------------------

    def for_identity(self, identity: Identity) -> Credentials:
        """Client credentials for any identity (e.g. a second tenant in a test)."""
        if self.insecure:
            if identity != LOCAL_ADMIN:
                raise ValueError("a plaintext local cluster knows only its admin token; start it with TLS for other identities")
            return Credentials.plaintext(self.admin_token, source="local cluster")
        assert self._ca is not None
        pair = certs.issue(self._ca, identity)
        return Credentials(self._ca.cert_pem, pair.cert_pem, pair.key_pem, source=f"local cluster identity {identity}")

    def client(self, tenant: str, name: str = "app") -> Credentials:
        return self.for_identity(Identity(Role.CLIENT, name, tenant))

    @property
    def admin(self) -> Credentials:
        return self.for_identity(LOCAL_ADMIN)

    def publish(self, endpoint: str) -> Path:
        """Writes the local admin's client credentials where clients look for `endpoint`'s."""
        target = cluster_dir(endpoint)
        if target.exists():
            shutil.rmtree(target)  # a stale directory of an earlier cluster on this port
        target.mkdir(parents=True)
        target.chmod(0o700)
        if self.insecure:
            (target / INSECURE_MARKER).write_text("this local cluster speaks plaintext (kvplane up --insecure)\n")
            (target / TOKEN_FILE).write_text(self.admin_token + "\n")
            (target / TOKEN_FILE).chmod(0o600)
        else:
            shutil.copy(self.ca_path, target / CA_FILE)
            for suffix in (".pem", ".key"):
                shutil.copy(self.directory / f"{CLIENT_STEM}{suffix}", target / f"{CLIENT_STEM}{suffix}")
            (target / f"{CLIENT_STEM}.key").chmod(0o600)
        self._published.append(target)
        return target

    def remove(self) -> None:
        for path in self._published:
            shutil.rmtree(path, ignore_errors=True)
        self._published.clear()
