"""The data plane's client side, shared by `metactl produce` / `consume` and the chaos
runner: where each partition is led (`Leaders`, from the controller's DescribeCluster),
one connection per broker (`Connections`, which under mutual TLS must prove it is the
`broker-<id>` DescribeCluster names), and `leader_request`, which sends to the leader
and follows it when it moves.

This module only sends and retries; what to produce or read, and what an answer means,
is its callers' business (`clients/producer.py`, `clients/consumer.py`, `chaos/`). It
must not import the CLI (`ops`).
"""

from __future__ import annotations

import contextlib

from clients.controller import INSECURE, Security, call
from metactl.errors import (
    InvalidRequestError,
    MetactlError,
    NetworkError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
)
from protocol.client import RetryPolicy, RpcClient
from protocol.messages.admin import DescribeClusterRequest, DescribeClusterResponse, PartitionState
from protocol.messages.unions import Message

# A leader moves within a session timeout (9 s by default): retry for about that long.
DATA_RETRY = RetryPolicy(attempts=12, base_s=0.05, cap_s=1.0)


class Leaders:
    """Where each partition of one topic is led, as the controller last said (within
    `timeout_s` per refresh, retries included)."""

    def __init__(
        self,
        controller: str,
        topic: str,
        retry: RetryPolicy,
        security: Security = INSECURE,
        *,
        timeout_s: float = 10.0,
    ) -> None:
        self.controller = controller
        self.topic = topic
        self.retry = retry
        self.security = security
        self.timeout_s = timeout_s
        self.partitions: dict[int, PartitionState] = {}
        self.endpoints: dict[int, str] = {}

    async def refresh(self) -> None:
        r = await call(
            self.controller,
            DescribeClusterRequest(topic=self.topic),
            self.timeout_s,
            retry=self.retry,
            security=self.security,
        )
        if not isinstance(r, DescribeClusterResponse):
            raise InvalidRequestError(f"unexpected {type(r).__name__} from the controller")
        self.partitions = {p.partition: p for p in r.partitions if p.topic == self.topic}
        self.endpoints = {b.broker_id: b.endpoint for b in r.brokers if not b.fenced}
        if not self.partitions:
            raise UnknownTopicOrPartitionError(f"topic {self.topic!r} does not exist")

    def leader(self, partition: int) -> tuple[int, str]:
        """(leader id, endpoint); NotLeaderOrFollowerError (retriable) if it has none."""
        p = self.partitions.get(partition)
        if p is None:
            raise UnknownTopicOrPartitionError(f"no partition {self.topic}-{partition}")
        endpoint = self.endpoints.get(p.leader, "")
        if p.leader < 0 or not endpoint:
            raise NotLeaderOrFollowerError(f"{self.topic}-{partition} has no reachable leader")
        return p.leader, endpoint


class Connections:
    """One connection per broker (a connection carries one request at a time), which
    under TLS must prove it is that broker."""

    def __init__(self, security: Security = INSECURE) -> None:
        self.security = security
        self._clients: dict[tuple[str, int], RpcClient] = {}

    def to(self, endpoint: str, broker_id: int) -> RpcClient:
        client = self._clients.get((endpoint, broker_id))
        if client is None:
            client = self.security.broker_client(endpoint, broker_id, connect_timeout=5.0)
            self._clients[(endpoint, broker_id)] = client
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


async def leader_request(
    leaders: Leaders,
    conns: Connections,
    partition: int,
    body: Message,
    *,
    timeout_s: float,
    retry: RetryPolicy,
) -> Message:
    """Send `body` to the partition's leader; on NOT_LEADER_OR_FOLLOWER or a broken
    connection refresh the metadata, and retry every retriable error with backoff."""
    attempt = 0
    while True:
        try:
            leader, endpoint = leaders.leader(partition)
            return await conns.to(endpoint, leader).request(body, timeout_s)
        except MetactlError as exc:
            if not retry.should_retry(exc, attempt):
                raise
            await retry.sleep(retry.backoff(attempt))
            attempt += 1
            if isinstance(exc, NotLeaderOrFollowerError | NetworkError):
                # The controller may be moving too: the next attempt says.
                with contextlib.suppress(MetactlError):
                    await leaders.refresh()
