"""How the CLI reaches a data directory or a running cluster.

Offline commands read the log directly; online ones talk to a running controller with
`call`, over the shared reconnecting client (`protocol.client`), retrying retriable
errors briefly.

Every client command takes `--bootstrap-controller HOST:PORT[,HOST:PORT...]` (Kafka's
KIP-919 name; `--controller` is an alias) and `--timeout S`, the most any one answer may
take, retries included. Given several controllers, a command follows NOT_CONTROLLER hints
and retries every retriable error until `--timeout` (`protocol.client.RideFailover`): a
failover is ridden, not reported (`add_controller_arguments`, `controller_address`, `within`). A
bad address is INVALID_CONFIG before anything is sent; no answer in time is
REQUEST_TIMED_OUT.

Connections are mutual TLS unless `--insecure` (`protocol.flags`): `security_from(args)`
gives the `Security` of a client command, acting as `--principal` (`admin` by default,
`viewer` read-only) with certificates from `--tls-dir`, `$METACTL_TLS_DIR` or
`./data/certs`. A server must prove it is `controller` (or `broker-<id>` for the broker
a data-plane request goes to). Library callers that pass no `Security` speak plaintext,
as `protocol.client` does; the secure default is the flags'.
"""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

from metactl.errors import (
    InvalidConfigurationError,
    MetactlError,
)
from metactl.numbers import decimal_arg
from metadata_log.etcd.tls import add_etcd_tls_arguments
from protocol.client import DEFAULT_TIMEOUT_S, Endpoints, RetryPolicy, RideFailover, RpcClient
from protocol.codec import parse_address
from protocol.flags import CLI_FALLBACK_TLS_DIR, add_tls_arguments, tls_identity
from protocol.messages import Message
from protocol.tls import ADMIN, CONTROLLER, TlsIdentity, broker_principal

# Where `cluster up` (and `make run`) listens.
DEFAULT_CONTROLLER: Final = "127.0.0.1:9093"

# An operator command retries a retriable refusal (e.g. no eligible leader yet) a few
# times within a couple of seconds, then reports it.
CLI_RETRY = RetryPolicy(attempts=4, base_s=0.2, cap_s=1.0)


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


async def ask(
    client: RpcClient, body: Message, timeout_s: float, *, retry: RetryPolicy = CLI_RETRY
) -> Message:
    """One request of a client command: retriable errors retried by `retry` while
    `timeout_s` lasts. An attempt still unanswered at the deadline is REQUEST_TIMED_OUT; a
    retry that would end past it is not made, and the error it would retry is raised (a
    closed port stays NETWORK_EXCEPTION, whatever the timeout)."""
    if retry is CLI_RETRY and isinstance(client.target, Endpoints):
        # A controller quorum: ride a failover until the deadline (`RideFailover`).
        retry = RideFailover(endpoints=len(client.target.addresses))
    # Each attempt's own timeout is later than the deadline: at the deadline the answer is
    # the request's REQUEST_TIMED_OUT, never a NETWORK_EXCEPTION without a message.
    return await client.request(body, timeout_s + 1.0, retry=retry, within_s=timeout_s)


@dataclass(frozen=True)
class Security:
    """A client's TLS identity (None: plaintext), and the principals it expects."""

    identity: TlsIdentity | None = None

    @cached_property
    def ssl(self) -> ssl.SSLContext | None:
        return self.identity.client_context() if self.identity is not None else None

    def expect(self, principal: str) -> str | None:
        """What `RpcClient(expect_principal=...)` should check: nothing without TLS."""
        return principal if self.identity is not None else None

    def controller_client(self, address: str, **kw: Any) -> RpcClient:
        return RpcClient(address, ssl=self.ssl, expect_principal=self.expect(CONTROLLER), **kw)

    def broker_client(self, address: str, broker_id: int, **kw: Any) -> RpcClient:
        expect = self.expect(broker_principal(broker_id))
        return RpcClient(address, ssl=self.ssl, expect_principal=expect, **kw)


INSECURE = Security()


def security_from(args: Any) -> Security:
    """A client command's `Security` from its `add_tls_arguments(client=True)` flags;
    InvalidConfigurationError (saying what to do) when TLS is on and no certificate is
    found, or a file is missing."""
    identity = tls_identity(
        args, getattr(args, "principal", ADMIN), fallbacks=[CLI_FALLBACK_TLS_DIR]
    )
    security = Security(identity)
    _ = security.ssl  # load the files now: a bad one is a named error before any request
    return security


async def call(
    address: str,
    body: Message,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    retry: RetryPolicy = CLI_RETRY,
    security: Security = INSECURE,
) -> Message:
    """One request to the controller at `address`; raises the coded error it answers, or
    REQUEST_TIMED_OUT when no answer came within `timeout_s`, retries included (`ask`)."""
    async with security.controller_client(address, connect_timeout=min(5.0, timeout_s)) as client:
        return await ask(client, body, timeout_s, retry=retry)
