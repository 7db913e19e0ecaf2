"""The CLI's flags for reaching a data directory or a running cluster.

Offline commands read the log directly; online ones talk to a running controller through
`clients.controller` (`ask`, `call`, `Security`).

Every client command takes `--bootstrap-controller HOST:PORT[,HOST:PORT...]` (Kafka's
KIP-919 name; `--controller` is an alias) and `--timeout S`, the most any one answer may
take, retries included. Given several controllers, a command follows NOT_CONTROLLER hints
and retries every retriable error until `--timeout` (`protocol.client.RideFailover`): a
failover is ridden, not reported (`add_controller_arguments`, `controller_address`). A
bad address is INVALID_CONFIG before anything is sent; no answer in time is
REQUEST_TIMED_OUT.

Connections are mutual TLS unless `--insecure` (`protocol.flags`): `security_from(args)`
gives the `Security` of a client command, acting as `--principal` (`admin` by default,
`viewer` read-only) with certificates from `--tls-dir`, `$METACTL_TLS_DIR` or
`./data/certs`. A server must prove it is `controller` (or `broker-<id>` for the broker
a data-plane request goes to).

This module reads flags only; sending is `clients.controller`'s, imported when a
command reads its flags (`security_from`), not to build its parser (issue 34).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Final

from metactl.errors import (
    InvalidConfigurationError,
    MetactlError,
)
from metactl.numbers import decimal_arg
from metadata_log.etcd.tls import add_etcd_tls_arguments
from protocol.flags import add_tls_arguments

if TYPE_CHECKING:
    from clients.controller import Security

# Where `cluster up` (and `make run`) listens.
DEFAULT_CONTROLLER: Final = "127.0.0.1:9093"
# `protocol.client.DEFAULT_TIMEOUT_S`, the client's own default, copied here for --help
# without importing the client (tests/ops/test_cli_imports.py checks that they agree).
DEFAULT_TIMEOUT_S: Final = 30.0


def add_controller_arguments(
    p: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup,
    parser: argparse.ArgumentParser | None = None,
) -> None:
    """`--bootstrap-controller` (alias `--controller`) on `p` (a parser, or a group that
    excludes `--data-dir`), and `--timeout` and the TLS flags on `parser` (default `p`)."""
    target = parser if parser is not None else p
    assert isinstance(target, argparse.ArgumentParser)
    p.add_argument(
        "--bootstrap-controller",
        "--controller",
        dest="controller",
        default=None,
        metavar="HOST:PORT[,...]",
        help=f"the controller(s) to ask (default {DEFAULT_CONTROLLER}, where `make run` "
        "listens); --controller is an alias",
    )
    target.add_argument(
        "--timeout",
        type=decimal_arg,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds any one answer may take, retries included (default {DEFAULT_TIMEOUT_S:g})",
    )
    add_tls_arguments(target, client=True)


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The two sources a reading command takes, one or the other: a running controller
    (`add_controller_arguments`) or a log read offline (`--data-dir`)."""
    source = parser.add_mutually_exclusive_group()
    add_controller_arguments(source, parser)
    source.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR|URL",
        help="read the log offline: a cluster's data directory, the controller's, or an "
        "etcd log's URL (etcd://HOST:PORT/PREFIX) (default: ask the controller)",
    )
    add_etcd_tls_arguments(parser)


def controller_address(args: Any) -> str:
    """The command's controller address(es), checked: INVALID_CONFIG names a bad one."""
    from protocol.address import parse_address

    text: str = getattr(args, "controller", None) or DEFAULT_CONTROLLER
    addresses = [a.strip() for a in text.split(",")]
    for a in addresses:
        try:
            _host, port = parse_address(a)
        except MetactlError as exc:
            raise InvalidConfigurationError(
                f"--bootstrap-controller {text!r}: {exc.message}"
            ) from None
        if not 1 <= port <= 65535:
            raise InvalidConfigurationError(
                f"--bootstrap-controller {text!r}: port {port} is not in 1..65535"
            )
    timeout = getattr(args, "timeout", DEFAULT_TIMEOUT_S)
    if not timeout > 0:
        raise InvalidConfigurationError(f"--timeout must be positive, got {timeout}")
    return ",".join(addresses)


def security_from(args: Any) -> Security:
    """A client command's `Security` from its `add_tls_arguments(client=True)` flags;
    InvalidConfigurationError (saying what to do) when TLS is on and no certificate is
    found, or a file is missing."""
    from clients.controller import Security
    from protocol.flags import CLI_FALLBACK_TLS_DIR, tls_identity
    from protocol.tls import ADMIN

    identity = tls_identity(
        args, getattr(args, "principal", ADMIN), fallbacks=[CLI_FALLBACK_TLS_DIR], client=True
    )
    security = Security(identity)
    _ = security.ssl  # load the files now: a bad one is a named error before any request
    return security
