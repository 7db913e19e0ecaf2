"""A cluster's certificate authority and identities, made with the `cryptography` package.

`metactl certs init` and `metactl cluster up` call `init_certs`, so nobody needs an openssl
recipe: one CA per cluster, and one certificate per principal (`controller`, `broker-<id>`,
`admin`, `viewer`), each with the principal as its common name and as a DNS name, plus
127.0.0.1 and localhost so ordinary TLS clients can reach loopback listeners. Keys are
P-256 ECDSA, written with mode 0600. The layout is protocol/tls.py's.

The metadata log's etcd gets a CA of its own, in ``<certs>/etcd`` (`init_etcd_certs`):
``server`` (the members' client listeners), ``peer`` (between members), and the client
certificates ``controller`` (the controllers) and ``admin`` (the operator's offline
tools: `log dump --data-dir etcd://...`, `storage info`). A CA of its own because etcd's
``--client-cert-auth`` admits *any* certificate its trusted CA signed, with every right
on every key: trusting the cluster CA would let a broker's or the viewer's certificate
rewrite the metadata log behind the controller's back. With its own CA only the
controllers and the operator reach etcd at all.

This module writes files and nothing else: it opens no socket and knows no rule about
what a principal may do.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from metactl.errors import InvalidConfigurationError
from metadata_log.etcd.tls import EtcdTls
from protocol.tls import ADMIN, CA_CERT, CA_KEY, CONTROLLER, VIEWER, broker_principal, cert_path
from protocol.tls import key_path as _key_path

VALID_DAYS: Final = 825
CA_NAME: Final = "metactl cluster CA"
ETCD_CA_NAME: Final = "metactl etcd CA"
ETCD_DIR: Final = "etcd"  # under the cluster's certificate directory
ETCD_SERVER: Final = "server"
ETCD_PEER: Final = "peer"
ETCD_CLIENTS: Final = (CONTROLLER, ADMIN)
ETCD_NAMES: Final = (ETCD_SERVER, ETCD_PEER, *ETCD_CLIENTS)


def default_names(broker_ids: Iterable[int]) -> list[str]:
    return [CONTROLLER, ADMIN, VIEWER, *(broker_principal(b) for b in broker_ids)]


def init_certs(certs_dir: Path, names: Iterable[str], *, ca_name: str = CA_NAME) -> list[str]:
    """Create the CA if absent and a certificate for each name that has none; returns the
    names it created. Existing files are kept, so re-running adds brokers."""
    certs_dir.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _load_or_create_ca(certs_dir, ca_name)
    created = []
    for name in names:
        if cert_path(certs_dir, name).exists():
            continue
        issue(certs_dir, name, ca_key, ca_cert)
        created.append(name)
    return created


def init_etcd_certs(certs_dir: Path) -> list[str]:
    """The etcd CA and certificates in ``certs_dir/etcd`` (the names it created, as
    ``etcd/<name>``); existing files are kept."""
    created = init_certs(certs_dir / ETCD_DIR, ETCD_NAMES, ca_name=ETCD_CA_NAME)
    return [f"{ETCD_DIR}/{name}" for name in created]


def etcd_dir(certs_dir: Path) -> Path:
    return certs_dir / ETCD_DIR


def etcd_client_tls(certs_dir: Path, name: str = CONTROLLER) -> EtcdTls:
    """A client's TLS to the local etcd: its CA and `name`'s certificate (controller or
    admin) in ``certs_dir/etcd``."""
    d = etcd_dir(certs_dir)
    return EtcdTls(d / CA_CERT, cert_path(d, name), _key_path(d, name))


def issue(
    certs_dir: Path, name: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _dt.datetime.now(_dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName(name),
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(_key_path(certs_dir, name), key)
    cert_path(certs_dir, name).write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load_or_create_ca(
    certs_dir: Path, ca_name: str = CA_NAME
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    cert_file, key_file = certs_dir / CA_CERT, certs_dir / CA_KEY
    if cert_file.exists() and key_file.exists():
        try:
            key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
            cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        except ValueError as exc:
            raise InvalidConfigurationError(f"cannot read the CA in {certs_dir}: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InvalidConfigurationError(f"{key_file} is not an EC private key")
        return key, cert
    if cert_file.exists() or key_file.exists():
        raise InvalidConfigurationError(
            f"{certs_dir} holds only half a CA ({CA_CERT} and {CA_KEY} go together)"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    now = _dt.datetime.now(_dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=VALID_DAYS))
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
        .sign(key, hashes.SHA256())
    )
    _write_key(key_file, key)
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
