"""How a tool reaches the controller: one request, answered or failed by its code.

`call` sends one request to the controller at an address (or to a quorum's, following
NOT_CONTROLLER to the active one: `protocol.client.Endpoints`), over the shared
reconnecting client (`protocol.client`), retrying retriable errors while its timeout
lasts (`ask`); no answer in time is REQUEST_TIMED_OUT. `Security` is a client's TLS
identity (None: plaintext) and the principals it expects a server to prove: `controller`,
or `broker-<id>` for the broker a data-plane request goes to. Library callers that pass
no `Security` speak plaintext, as `protocol.client` does; the CLI's secure default comes
from its flags (`--tls-dir`, `--insecure`).

Used by the CLI's commands, the local cluster's supervisor (`localcluster`), the chaos
runner (`chaos`), the data-plane clients (`clients.data`), tests and benchmarks. It sends
and retries only: what a request means is its caller's business. It must not import the
CLI (`ops`), nor any server (`controller`, `brokers_stub`).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from protocol.client import DEFAULT_TIMEOUT_S, Endpoints, RetryPolicy, RideFailover, RpcClient
from protocol.messages.unions import Message
from protocol.tls import CONTROLLER, TlsIdentity, broker_principal

# An operator command retries a retriable refusal (e.g. no eligible leader yet) a few
# times within a couple of seconds, then reports it.
CLI_RETRY = RetryPolicy(attempts=4, base_s=0.2, cap_s=1.0)


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
