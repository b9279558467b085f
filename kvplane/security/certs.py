"""A development certificate authority and per-component certificates (the `cryptography` package).

`create_ca` makes a self-signed CA (ECDSA P-256); `issue` signs a certificate for one identity,
with its SPIFFE ID in the URI SAN (kvplane.security.identity). Usages follow the role:
- control planes and workers are gRPC servers and clients of their peers: serverAuth and
  clientAuth, their server name (NAME.ROLE.kvplane, which peers verify) and the DNS names and IP
  addresses they are dialed at in the other SANs;
- clients and admins only call: clientAuth alone and no DNS or IP SAN, so their certificate
  cannot serve (a TLS client refuses it: "unsupported certificate purpose"), whatever it dials.

Files: `write_pair(dir, stem, ...)` writes STEM.pem (certificate) and STEM.key (private key, mode
0600). A production deployment may use any CA (cert-manager, Vault, SPIRE): kvplane only reads
the SPIFFE ID in the URI SAN.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kvplane.security.identity import Identity, IdentityError, identity_from_spiffe_id
from kvplane.security.limits import CERT_DAYS

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_CLOCK_SKEW = datetime.timedelta(minutes=5)  # valid a little before now: peers' clocks differ


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + datetime.timedelta(days=days))


def create_ca(common_name: str = "kvplane development CA", days: int = CERT_DAYS) -> KeyPair:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
    builder = _validity(builder.serial_number(x509.random_serial_number()), days)
    builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    builder = builder.add_extension(
        x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False,
        ),
        critical=True,
    )  # fmt: skip
    builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _san(hosts: tuple[str, ...] | list[str], identity: Identity) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.spiffe_id())]
    if identity.serves:
        names.append(x509.DNSName(identity.server_name()))
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def issue(ca: KeyPair, identity: Identity, hosts: tuple[str, ...] | list[str] | None = None, days: int = CERT_DAYS) -> KeyPair:
    """A certificate for `identity`, signed by `ca`. A serving identity's is valid for the given DNS
    names / IP addresses (default LOCAL_HOSTS) and its server name; a client's or admin's names no
    host and cannot serve (hosts given for one are an error)."""
    if not identity.serves and hosts:
        raise IdentityError(f"{identity} only calls servers: its certificate names no host (it was given {list(hosts)[:4]})")
    if identity.serves and hosts is None:
        hosts = LOCAL_HOSTS
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if identity.serves else [ExtendedKeyUsageOID.CLIENT_AUTH]
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = _new_key()
    subject = x509.Name([
        x509.NameAttribute(NameOID.COMMON_NAME, identity.name),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, identity.role.value),
    ])  # fmt: skip
    builder = x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
    builder = _validity(builder.serial_number(x509.random_serial_number()), days)
    builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    builder = builder.add_extension(_san(hosts or (), identity), critical=False)
    builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
        critical=False,
    )
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_server(ca: KeyPair, common_name: str, hosts: tuple[str, ...] | list[str] = LOCAL_HOSTS, days: int = CERT_DAYS) -> KeyPair:
    """A certificate for a server outside kvplane's identities (etcd): CN and host SANs only.

    For etcd clients the CN is what matters: with etcd's --client-cert-auth it is the etcd user.
    """
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = _new_key()
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
    builder = _validity(builder.serial_number(x509.random_serial_number()), days)
    builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    builder = builder.add_extension(
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
    )
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def identity_of(cert_pem: bytes) -> Identity:
    """The kvplane identity in a certificate's URI SAN; IdentityError when it has none."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        raise IdentityError(f"not a PEM certificate ({e})") from None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise IdentityError("the certificate has no subject alternative names, so no kvplane identity") from None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    spiffe = [u for u in uris if u.startswith("spiffe://")]
    if len(spiffe) != 1:
        raise IdentityError(f"the certificate must carry exactly one spiffe:// URI SAN, it has {len(spiffe)}")
    return identity_from_spiffe_id(spiffe[0])


def check_serves(cert_pem: bytes, identity: Identity) -> None:
    """IdentityError unless the certificate can serve as `identity` to kvplane peers: serverAuth
    (or no usage restriction) and the server name they verify (identity.server_name()) in a DNS
    SAN. Servers call it at start, so a certificate from another CA setup fails there, by name,
    instead of in every peer's handshake."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        if ExtendedKeyUsageOID.SERVER_AUTH not in usages:
            raise IdentityError(f"the certificate of {identity} lacks the serverAuth extended key usage, so peers refuse it as a server")
    except x509.ExtensionNotFound:
        pass  # no restriction: any usage
    try:
        dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    wanted = identity.server_name()
    if wanted.lower() not in (d.lower() for d in dns):
        raise IdentityError(
            f"the certificate of {identity} has no DNS SAN {wanted!r}: peers dial it by that name and refuse it without; "
            "issue it again (`kvplane certs issue`, or add that name to your CA's certificate request)"
        )


def write_pair(directory: Path, stem: str, pair: KeyPair) -> tuple[Path, Path]:
    """Writes STEM.pem and STEM.key (0600) under `directory`; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(pair.cert_pem)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pair.key_pem)
    return cert_path, key_path


def read_pair(directory: Path, stem: str) -> KeyPair:
    return KeyPair((directory / f"{stem}.pem").read_bytes(), (directory / f"{stem}.key").read_bytes())
