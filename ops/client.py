"""How the CLI reaches a data directory or a running cluster.

Offline commands read the log directly; online ones talk to a running controller with
`call`, over the shared reconnecting client (`protocol.client`), retrying retriable
errors briefly.

Connections are mutual TLS unless `--insecure` (`protocol.flags`): `security_from(args)`
gives the `Security` of a client command, acting as `--principal` (`admin` by default,
`viewer` read-only) with certificates from `--tls-dir`, `$METACTL_TLS_DIR` or
`./data/certs`. A server must prove it is `controller` (or `broker-<id>` for the broker
a data-plane request goes to). Library callers that pass no `Security` speak plaintext,
as `protocol.client` does; the secure default is the flags'.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from controller.runtime.driver import load_image
from metadata_image.image import ClusterImage
from metadata_log.sqlite_store import SqliteLogStore
from protocol.client import DEFAULT_TIMEOUT_S, RetryPolicy, RpcClient, request_once
from protocol.flags import CLI_FALLBACK_TLS_DIR, tls_identity
from protocol.messages import Message
from protocol.tls import ADMIN, CONTROLLER, TlsIdentity, broker_principal

# An operator command retries a retriable refusal (e.g. no eligible leader yet) a few
# times within a couple of seconds, then reports it.
CLI_RETRY = RetryPolicy(attempts=4, base_s=0.2, cap_s=1.0)


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
    """One request to the controller at `address`; raises the coded error it answers."""
    return await request_once(
        address,
        body,
        timeout_s,
        retry=retry,
        ssl=security.ssl,
        expect_principal=security.expect(CONTROLLER),
    )


def controller_log_dir(data_dir: Path) -> Path:
    """A cluster data dir keeps the controller's log in `controller/`; accept either."""
    sub = data_dir / "controller"
    return sub if sub.is_dir() else data_dir


async def offline_image(data_dir: Path) -> tuple[ClusterImage, int]:
    store = await SqliteLogStore.open(controller_log_dir(data_dir), read_only=True)
    try:
        return await load_image(store), store.end_offset
    finally:
        await store.close()
