"""Throwaway TLS material made at test time (never committed): a CA, a server certificate for
127.0.0.1 and localhost, and a client certificate, all signed by that CA."""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: str, key: ec.EllipticCurvePrivateKey) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


def _write_cert(path: str, cert: x509.Certificate) -> None:
    with open(path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))


def _issue(subject: str, key, issuer: x509.Name, issuer_key, *, ca: bool = False,
           usage: list | None = None, sans: list | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                        critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_tls_files(directory: str) -> TlsFiles:
    """Write a CA, a server certificate and a client certificate (with their keys) to `directory`."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue("queue-server test CA", ca_key, _name("queue-server test CA"), ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _issue("127.0.0.1", server_key, ca_cert.subject, ca_key,
                         usage=[ExtendedKeyUsageOID.SERVER_AUTH],
                         sans=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _issue("queue client", client_key, ca_cert.subject, ca_key,
                         usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    files = TlsFiles(*(os.path.join(directory, n) for n in (
        "ca.pem", "server.pem", "server.key", "client.pem", "client.key")))
    _write_cert(files.ca, ca_cert)
    _write_cert(files.server_cert, server_cert)
    _write_key(files.server_key, server_key)
    _write_cert(files.client_cert, client_cert)
    _write_key(files.client_key, client_key)
    return files
