"""Mutual TLS for every listener: contexts from a certificate directory, and principals.

A cluster's certificates live in one directory (`metactl certs init` writes it):

    ca.pem                 the cluster CA every peer trusts (its key, ca-key.pem, stays there)
    <name>.pem, <name>-key.pem   one identity each: `controller`, `broker-<id>`, `admin`, `viewer`

A peer's *principal* is the common name of its certificate, verified against the cluster CA
in both directions (mutual TLS). Host names are not checked: listeners bind loopback or
ephemeral addresses, and identity is the principal, which the receiver checks against what
it expects (the controller against the broker id a request names, a broker against
`controller`). What each principal may do is the controller's business
(`controller/core/authz.py`), not this module's.

This module builds `ssl.SSLContext`s with Python's `ssl` module and reads principals. It
does no IO beyond loading the certificate files, and it never makes certificates
(`localcluster/certs.py` does, with the `cryptography` package).
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from metactl.errors import InvalidConfigurationError

CA_CERT: Final = "ca.pem"
CA_KEY: Final = "ca-key.pem"

CONTROLLER: Final = "controller"
ADMIN: Final = "admin"
VIEWER: Final = "viewer"
_BROKER: Final = re.compile(r"broker-(0|[1-9][0-9]{0,9})")
MAX_BROKER_ID: Final = 2**31 - 1


def broker_principal(broker_id: int) -> str:
    return f"broker-{broker_id}"


def broker_id_of(principal: str | None) -> int | None:
    """The broker id a `broker-<id>` principal speaks for, or None for any other name."""
    if principal is None:
        return None
    m = _BROKER.fullmatch(principal)
    if m is None:
        return None
    broker_id = int(m.group(1))
    return broker_id if broker_id <= MAX_BROKER_ID else None


def cert_path(certs_dir: Path, name: str) -> Path:
    return certs_dir / f"{name}.pem"


def key_path(certs_dir: Path, name: str) -> Path:
    return certs_dir / f"{name}-key.pem"


@dataclass(frozen=True)
class TlsIdentity:
    """One principal's certificate and key, and the CA it trusts."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def from_dir(cls, certs_dir: Path, name: str) -> TlsIdentity:
        """`name`'s files in a `metactl certs init` directory; InvalidConfigurationError
        naming the missing file if one is absent."""
        identity = cls(certs_dir / CA_CERT, cert_path(certs_dir, name), key_path(certs_dir, name))
        for path in (identity.ca, identity.cert, identity.key):
            if not path.is_file():
                raise InvalidConfigurationError(
                    f"TLS file {path} is missing (point --tls-dir at the running cluster's "
                    f"certificates; `metactl certs init --data-dir D` makes new ones; or "
                    f"pass --insecure)"
                )
        return identity

    def server_context(self) -> ssl.SSLContext:
        """A listener's context: TLS 1.2 or newer, a client certificate required."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._load(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """A client's context: the server's certificate must chain to the cluster CA;
        its principal is checked by the caller (`RpcClient(expect_principal=...)`)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        self._load(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def _load(self, ctx: ssl.SSLContext) -> None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_verify_locations(cafile=str(self.ca))
            ctx.load_cert_chain(certfile=str(self.cert), keyfile=str(self.key))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidConfigurationError(
                f"cannot load TLS files {self.cert}, {self.key} (CA {self.ca}): {exc}"
            ) from None


def principal_of(peercert: dict[str, Any] | None) -> str | None:
    """The common name of a verified peer certificate (`SSLSocket.getpeercert()`), or None
    when there is no certificate or it names no common name."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str):
                return value
    return None


def is_cluster_principal(principal: str | None) -> bool:
    """True for the cluster's own members, `controller` and `broker-<id>`: the principals
    whose sessions a listener keeps slots for outside its client cap (protocol/server.py),
    as Kafka exempts its inter-broker listener from max.connections."""
    return principal == CONTROLLER or broker_id_of(principal) is not None
