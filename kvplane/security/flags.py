"""The security flags of `kvplane controlplane`, `kvplane agent` and the client commands, in one place.

Servers: --tls-cert/--tls-key/--tls-ca (or $KVPLANE_TLS_CERT/_KEY/_CA) for mutual TLS, or an
explicit --insecure for plaintext; there is no third way. Agents also take --join-token
($KVPLANE_JOIN_TOKEN), the control plane --join-token, --admin-token ($KVPLANE_ADMIN_TOKEN) and
--tokens-file. Clients: the same --tls-* flags, --token and --insecure, each optional (see
kvplane.security.credentials.resolve_client for what they fall back to).
"""

from __future__ import annotations

import argparse
import logging
import os

from kvplane.security.auth import TokenTable, worker_join_identity
from kvplane.security.credentials import ENV_CA, ENV_CERT, ENV_KEY, ENV_TOKEN, Credentials, CredentialsError
from kvplane.security.identity import Identity, Role

log = logging.getLogger(__name__)

ENV_JOIN_TOKEN = "KVPLANE_JOIN_TOKEN"
ENV_ADMIN_TOKEN = "KVPLANE_ADMIN_TOKEN"
INSECURE_WARNING = "%s runs WITHOUT TLS (--insecure): every call, prompt and KV block crosses the network in plaintext"


def _add_tls(group: argparse._ArgumentGroup, cert_help: str) -> None:
    group.add_argument("--tls-cert", default=None, metavar="FILE", help=f"{cert_help} (default ${ENV_CERT})")
    group.add_argument("--tls-key", default=None, metavar="FILE", help=f"its private key, PEM (default ${ENV_KEY})")
    group.add_argument("--tls-ca", default=None, metavar="FILE", help=f"the CA that signs the cluster's certificates (default ${ENV_CA})")


def add_server_arguments(parser: argparse.ArgumentParser, *, controlplane: bool) -> None:
    group = parser.add_argument_group("security (docs/security.md)")
    cert_help = (
        "this replica's certificate (PEM, role controlplane): mutual TLS on its port and to agents"
        if controlplane
        else "the worker's certificate (PEM); the worker id it names is the agent's id when --worker-id is not given"
    )
    _add_tls(group, cert_help)
    group.add_argument("--insecure", action="store_true",
                       help="plaintext gRPC with no certificates (development only; logs a warning); a server needs this or --tls-*")  # fmt: skip
    if controlplane:
        group.add_argument(
            "--join-token", default=None, metavar="TOKEN",
            help=f"a token that lets an agent register any free worker id (default ${ENV_JOIN_TOKEN}); with mTLS, worker certificates do",
        )  # fmt: skip
        group.add_argument(
            "--admin-token", default=None, metavar="TOKEN", help=f"a bearer token with the admin role (default ${ENV_ADMIN_TOKEN})"
        )
        group.add_argument("--tokens-file", default=None, metavar="FILE", help="bearer tokens, one `TOKEN,ROLE,NAME[,TENANT]` per line")
    else:
        group.add_argument(
            "--join-token", default=None, metavar="TOKEN",
            help=f"the cluster's join token, for a control plane that does not take this agent's certificate (default ${ENV_JOIN_TOKEN})",
        )  # fmt: skip


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("credentials (default: $KVPLANE_TLS_*, $KVPLANE_TOKEN, else what `kvplane up` wrote)")
    _add_tls(group, "the client certificate (PEM)")
    group.add_argument("--token", default=None, help=f"a bearer token (default ${ENV_TOKEN})")
    group.add_argument("--insecure", action="store_true", help="plaintext gRPC (only for a server started with --insecure)")


def server_credentials_from_args(args: argparse.Namespace, what: str) -> Credentials:
    """The server's credentials; CredentialsError when neither TLS files nor --insecure are given."""
    cert = args.tls_cert or os.environ.get(ENV_CERT)
    key = args.tls_key or os.environ.get(ENV_KEY)
    ca = args.tls_ca or os.environ.get(ENV_CA)
    # An agent presents the join token; the control plane only checks it (tokens_from_args).
    token = "" if _is_controlplane(args) else (args.join_token or os.environ.get(ENV_JOIN_TOKEN, ""))
    if args.insecure:
        if args.tls_cert or args.tls_key or args.tls_ca:
            raise CredentialsError("--insecure and --tls-* contradict each other: give one or the other")
        log.warning(INSECURE_WARNING, what)
        return Credentials.plaintext(token, source="--insecure")
    if not (cert and key and ca):
        raise CredentialsError(
            f"{what} needs --tls-cert, --tls-key and --tls-ca (or ${ENV_CERT}, ${ENV_KEY}, ${ENV_CA}); "
            "`kvplane certs` makes them. For plaintext in development, pass --insecure"
        )
    credentials = Credentials.from_files(cert, key, ca, token=token, source="--tls-*")
    identity = credentials.identity()  # fails early, with the reason, on a certificate without a kvplane identity
    if identity is not None and identity.role is Role.WORKER:
        from kvplane.security.certs import check_serves  # noqa: PLC0415 (cryptography loads only when needed)

        check_serves(credentials.cert_pem, identity)  # peers verify its server name: fail here, not in their handshakes
    return credentials


def _is_controlplane(args: argparse.Namespace) -> bool:
    return hasattr(args, "admin_token")


def tokens_from_args(args: argparse.Namespace) -> TokenTable:
    """The control plane's bearer tokens: --tokens-file, the join token and the admin token."""
    table = TokenTable.from_file(args.tokens_file) if args.tokens_file else TokenTable()
    join = args.join_token or os.environ.get(ENV_JOIN_TOKEN)
    if join:
        table.add(join, worker_join_identity())
    admin = args.admin_token or os.environ.get(ENV_ADMIN_TOKEN)
    if admin:
        table.add(admin, Identity(Role.ADMIN, "admin-token"))
    return table


def client_credentials_from_args(args: argparse.Namespace) -> Credentials | None:
    """Explicit client credentials from the flags, or None to let the SDK look for them (--token is
    passed to the SDK on its own, so it adds to whatever credentials are found)."""
    if args.insecure:
        if args.tls_cert or args.tls_key or args.tls_ca:
            raise CredentialsError("--insecure and --tls-* contradict each other: give one or the other")
        return Credentials.plaintext(source="--insecure")
    if args.tls_cert or args.tls_key or args.tls_ca:
        return Credentials.from_files(args.tls_cert, args.tls_key, args.tls_ca, source="--tls-*")
    return None
