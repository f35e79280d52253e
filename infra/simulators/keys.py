"""Key material a simulator generates at start: a TLS CA + server cert, signing keys, secrets.

Everything is written under the simulator's state directory (files 0600) so that a client can be
pointed at it: `ca.pem` to trust, the APNs `.p8` key, the FCM service-account JSON, ...
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "TlsFiles",
    "ec_private_pem",
    "generate_tls",
    "public_pem",
    "random_hex",
    "rsa_private_pem",
    "write_private",
]


class TlsFiles:
    """Paths of a generated TLS setup."""

    def __init__(self, ca: Path, cert: Path, key: Path) -> None:
        self.ca = ca
        self.cert = cert
        self.key = key


def write_private(path: Path, data: bytes) -> Path:
    """Write `data` to `path` readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def ec_private_pem() -> bytes:
    """A fresh P-256 private key, PKCS#8 PEM (the format of an APNs .p8 key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def rsa_private_pem() -> bytes:
    """A fresh RSA-2048 private key, PKCS#8 PEM (the format of a service-account key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_pem(private_pem: bytes) -> str:
    """The SubjectPublicKeyInfo PEM of a PEM private key."""
    key = serialization.load_pem_private_key(private_pem, password=None)
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def random_hex(nbytes: int) -> str:
    """`2 * nbytes` random hex characters."""
    return secrets.token_hex(nbytes)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def generate_tls(directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> TlsFiles:
    """A throw-away CA and a server certificate for `hosts`, written to `directory`.

    Clients trust `ca.pem`; the server uses `cert.pem` + `key.pem` (PKCS#8, as Granian requires).
    """
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("Herald simulator CA"))
        .issuer_name(_name("Herald simulator CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files = TlsFiles(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    write_private(files.cert, cert.public_bytes(pem))
    write_private(
        files.key,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    # Written last: its presence tells a waiting client that the TLS files are complete.
    write_private(files.ca, ca_cert.public_bytes(pem))
    return files
