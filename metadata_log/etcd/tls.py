"""TLS to etcd: which files a client presents, from `--etcd-cacert/--etcd-cert/--etcd-key`
(etcdctl's `--cacert/--cert/--key`) or ``METACTL_ETCD_CACERT``/``_CERT``/``_KEY``.

* `EtcdTls`: the CA that signs the etcd members' certificates and, for an etcd started
  with ``--client-cert-auth``, this client's certificate and key. Without any of them a
  client speaks plaintext (an etcd on a trusted network, or ``cluster up --insecure``).
* `add_etcd_tls_arguments` and `etcd_tls_from`: the three flags, on every command that
  opens an ``etcd://`` log (the controller, ``storage info``, ``log dump|verify|tail|
  mirror|export``, ``describe``/``events --data-dir etcd://...``), and their reader, which
  also makes them the process's default (`default_tls`): a command's flags reach the
  etcd client wherever the log is opened, without threading them through every layer
  (`metactl`'s main applies them for every command that has them). Until a command sets
  it, the default is the environment variables'. An explicit `EtcdTls` given to
  `EtcdTarget.parse` (the controller's, a test's) wins.

`metactl certs init` writes a local cluster's files (``<certs>/etcd``, `localcluster.certs`), and
`cluster up --etcd N` passes them to its controllers. This module reads paths and files
only: it imports neither gRPC nor the etcd client library (the command line needs it
without them).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from metactl.errors import InvalidConfigurationError

__all__ = [
    "ENV_CACERT",
    "ENV_CERT",
    "ENV_KEY",
    "PROCESS_DEFAULT",
    "EtcdTls",
    "ProcessDefault",
    "add_etcd_tls_arguments",
    "default_tls",
    "etcd_tls_from",
    "resolve_tls",
    "set_default_tls",
    "tls_flags",
]

ENV_CACERT: Final = "METACTL_ETCD_CACERT"
ENV_CERT: Final = "METACTL_ETCD_CERT"
ENV_KEY: Final = "METACTL_ETCD_KEY"


@dataclass(frozen=True)
class EtcdTls:
    """A client's TLS to etcd: the CA its members' certificates chain to, and (for
    ``--client-cert-auth``) the client's own certificate and key."""

    cacert: Path
    cert: Path | None = None
    key: Path | None = None

    def load(self) -> tuple[bytes, bytes | None, bytes | None]:
        """(CA, certificate chain, key) as PEM bytes; INVALID_CONFIG naming a file that
        cannot be read."""

        def read(path: Path | None) -> bytes | None:
            if path is None:
                return None
            try:
                return path.read_bytes()
            except OSError as exc:
                raise InvalidConfigurationError(
                    f"etcd TLS file {path}: {exc.strerror or exc} (`metactl certs init` "
                    "writes a local cluster's in <certs>/etcd)"
                ) from None

        ca = read(self.cacert)
        assert ca is not None
        return ca, read(self.cert), read(self.key)

    def flags(self) -> list[str]:
        """The command-line flags that give this to another metactl process."""
        out = ["--etcd-cacert", str(self.cacert)]
        if self.cert is not None and self.key is not None:
            out += ["--etcd-cert", str(self.cert), "--etcd-key", str(self.key)]
        return out


def tls_flags(tls: EtcdTls | None) -> list[str]:
    """`EtcdTls.flags`, or none for plaintext."""
    return tls.flags() if tls is not None else []


def add_etcd_tls_arguments(p: argparse.ArgumentParser) -> None:
    """`--etcd-cacert`, `--etcd-cert`, `--etcd-key`: TLS to an etcd log."""
    g = p.add_argument_group(
        "etcd TLS (an etcd:// log)",
        "TLS to etcd: the CA of its members' certificates, and a client certificate for "
        f"an etcd with --client-cert-auth; else ${ENV_CACERT}, ${ENV_CERT}, ${ENV_KEY}; "
        "none: plaintext",
    )
    g.add_argument(
        "--etcd-cacert",
        type=Path,
        default=None,
        metavar="FILE",
        help="the CA that signs the etcd members' certificates (turns TLS on)",
    )
    g.add_argument(
        "--etcd-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help="this client's certificate for etcd (with --etcd-key)",
    )
    g.add_argument(
        "--etcd-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="this client's private key for etcd (with --etcd-cert)",
    )


def etcd_tls_from(
    args: Any, *, environ: Mapping[str, str] | None = None, set_default: bool = True
) -> EtcdTls | None:
    """The `EtcdTls` of `add_etcd_tls_arguments`' flags (each flag over its environment
    variable), or None: plaintext. With `set_default` it becomes the process's default
    as well. INVALID_CONFIG for a certificate without its key (or the reverse), a client
    certificate without a CA, or a file that does not exist."""
    env = os.environ if environ is None else environ

    def value(attr: str, var: str) -> Path | None:
        given = getattr(args, attr, None)
        if isinstance(given, str | os.PathLike) and os.fspath(given):
            return Path(given)
        return Path(env[var]) if env.get(var) else None

    cacert = value("etcd_cacert", ENV_CACERT)
    cert = value("etcd_cert", ENV_CERT)
    key = value("etcd_key", ENV_KEY)
    tls: EtcdTls | None = None
    if (cert is None) != (key is None):
        raise InvalidConfigurationError(
            "--etcd-cert and --etcd-key go together: give both (a client certificate and "
            "its key) or neither"
        )
    if cacert is None and cert is not None:
        raise InvalidConfigurationError(
            "--etcd-cert needs --etcd-cacert: the CA that signs the etcd members' "
            "certificates (a local cluster's is <certs>/etcd/ca.pem)"
        )
    if cacert is not None:
        for path in (cacert, cert, key):
            if path is not None and not path.is_file():
                raise InvalidConfigurationError(
                    f"etcd TLS file {path} does not exist (`metactl certs init --data-dir D` "
                    "writes a local cluster's in D/certs/etcd)"
                )
        tls = EtcdTls(cacert, cert, key)
    if set_default:
        set_default_tls(tls)
    return tls


class ProcessDefault:
    """The type of `PROCESS_DEFAULT`."""

    def __repr__(self) -> str:
        return "PROCESS_DEFAULT"


PROCESS_DEFAULT: Final = ProcessDefault()
"""`EtcdTarget.parse(url, tls=PROCESS_DEFAULT)`: the process's default (`default_tls`)."""

# The process's default, in a box; PROCESS_DEFAULT while no command has set it.
_default: list[EtcdTls | ProcessDefault | None] = [PROCESS_DEFAULT]


def set_default_tls(tls: EtcdTls | ProcessDefault | None) -> None:
    """Make `tls` what an ``etcd://`` URL opened without an explicit `EtcdTls` uses
    (None: plaintext; PROCESS_DEFAULT: back to the environment variables)."""
    _default[0] = tls


def default_tls() -> EtcdTls | None:
    """What a command set, else what ``METACTL_ETCD_*`` say (None: plaintext)."""
    chosen = _default[0]
    if isinstance(chosen, ProcessDefault):
        return etcd_tls_from(None, set_default=False)
    return chosen


def resolve_tls(tls: EtcdTls | ProcessDefault | None) -> EtcdTls | None:
    return default_tls() if isinstance(tls, ProcessDefault) else tls
