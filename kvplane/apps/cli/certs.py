"""`kvplane certs`: a development CA and certificates for each component (docs/security.md).

    kvplane certs ca --dir DIR
    kvplane certs issue --dir DIR --role worker --name decode-0 --host worker-1.internal
    kvplane certs issue --dir DIR --role client --tenant acme --name web
    kvplane certs show FILE

`ca` writes DIR/ca.pem and DIR/ca.key (keep ca.key offline in production); `issue` writes
DIR/NAME.pem and DIR/NAME.key signed by that CA, naming the identity in the certificate's URI SAN.
A worker's name is its worker id. Control planes and workers serve: give every DNS name or IP
address peers dial with --host; their certificate also names NAME.ROLE.kvplane, which peers
verify. Clients and admins only call: their certificate has clientAuth alone and names no host.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvplane.apps.cli.common import CliError, import_extra, positive_int, print_json, usage_error
from kvplane.security.identity import Identity, IdentityError, Role
from kvplane.security.limits import CERT_DAYS


def _certs():
    """kvplane.security.certs, which needs `cryptography` (the [server] extra, not the SDK's base install)."""
    return import_extra("kvplane.security.certs", extra="server", what="kvplane certs")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "certs", help="make a development CA and per-component certificates",
        description="Makes a CA and certificates for control planes, workers, clients and admins, with the `cryptography` package.",
    )  # fmt: skip
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    parser.set_defaults(func=lambda args: usage_error(parser))

    ca = commands.add_parser("ca", help="create a CA (ca.pem, ca.key)")
    ca.add_argument("--dir", required=True, type=Path, help="where to write ca.pem and ca.key")
    ca.add_argument("--days", type=positive_int, default=CERT_DAYS, help="validity (default %(default)s)")
    ca.add_argument("--force", action="store_true", help="overwrite an existing CA")
    ca.set_defaults(func=run_ca)

    issue = commands.add_parser("issue", help="issue a certificate signed by the CA in --dir")
    issue.add_argument("--dir", required=True, type=Path, help="the CA's directory; the certificate is written here too")
    issue.add_argument("--role", required=True, choices=[r.value for r in Role], help="what the holder is")
    issue.add_argument("--name", required=True, help="the identity's name (a worker's is its worker id)")
    issue.add_argument("--tenant", default="", help="clients only: the tenant the requests count for")
    issue.add_argument(
        "--host", action="append", default=[], help="servers only: a DNS name or IP it is dialed at (repeat; default localhost)"
    )
    issue.add_argument("--days", type=positive_int, default=CERT_DAYS, help="validity (default %(default)s)")
    issue.add_argument("--out", default="", help="file stem to write (default: NAME, or TENANT.NAME for clients)")
    issue.set_defaults(func=run_issue)

    show = commands.add_parser("show", help="print the kvplane identity in a certificate")
    show.add_argument("file", type=Path)
    show.set_defaults(func=run_show)


def run_ca(args: argparse.Namespace) -> int:
    certs = _certs()
    if (args.dir / "ca.key").exists() and not args.force:
        raise CliError(f"{args.dir / 'ca.key'} exists; pass --force to replace the CA (every certificate it signed stops working)")
    cert, key = certs.write_pair(args.dir, "ca", certs.create_ca(days=args.days))
    print(f"CA certificate: {cert}\nCA private key: {key} (keep it secret; only `kvplane certs issue` needs it)")
    return 0


def run_issue(args: argparse.Namespace) -> int:
    certs = _certs()
    try:
        identity = Identity(Role(args.role), args.name, args.tenant)
        if args.host and not identity.serves:
            raise IdentityError(f"--host is for certificates that serve (controlplane, worker); a {args.role} only calls")
        ca = certs.read_pair(args.dir, "ca")
    except IdentityError as e:
        raise CliError(str(e), 2) from None
    except OSError as e:
        raise CliError(f"cannot read the CA in {args.dir} ({e.strerror or e}); run `kvplane certs ca --dir {args.dir}` first") from None
    stem = args.out or (f"{args.tenant}.{args.name}" if args.tenant else args.name)
    cert, key = certs.write_pair(args.dir, stem, certs.issue(ca, identity, args.host or None, args.days))
    print(f"{identity.spiffe_id()}\ncertificate: {cert}\nprivate key: {key}\nCA: {args.dir / 'ca.pem'}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    certs = _certs()
    try:
        identity = certs.identity_of(args.file.read_bytes())
    except (OSError, IdentityError) as e:
        raise CliError(f"{args.file}: {e}") from None
    print_json({"role": identity.role.value, "name": identity.name, "tenant": identity.tenant, "spiffe_id": identity.spiffe_id()})
    return 0
