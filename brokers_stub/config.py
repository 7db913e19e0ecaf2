"""The broker's settings, as one immutable value built from the command line.

Data only: defaults and simple validation. Nothing here reads files or opens sockets.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from protocol.codec import DEFAULT_MAX_FRAME_BYTES
from protocol.limits import ServerLimits
from protocol.tls import TlsIdentity


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    broker_id: int
    controller: str  # HOST:PORT of the controller service
    data_dir: Path
    listen: str = "127.0.0.1:0"
    # HOST:PORT of the Kafka listener (brokers_stub/kafka; None: none), registered with the
    # controller so that every broker tells Kafka clients where the others are.
    kafka_listen: str | None = None
    # The cluster id of the storage identity (meta.properties), for Kafka's Metadata and
    # DescribeCluster (None: a directory not yet told its cluster).
    cluster_id: str | None = None
    rack: str | None = None
    heartbeat_interval_ms: int = 2000
    session_timeout_ms: int = 9000  # the controller's; bounds an unreachable shutdown
    lose_unflushed: bool = False
    flush_interval_ms: int = 1000
    # fsync a replica as soon as this many records are unflushed (Kafka's flush.messages;
    # None: off, the default; 1: every append is fsynced before it is answered)
    flush_messages: int | None = None
    max_batch_records: int = 10_000  # a larger Produce batch gets MESSAGE_TOO_LARGE
    replica_lag_time_max_ms: int = 3000
    # A follower's pause after a fetch that was refused or brought nothing new sooner than
    # this (a leader that does not long-poll), and the round interval of partitions beyond
    # `replica_fetch_sessions_max` (see fetcher.py).
    fetch_interval_ms: int = 100
    # Long poll (Kafka's replica.fetch.wait.max.ms): how long a leader may hold a follower's
    # fetch while it has nothing new for it. Capped at half the replica lag time (see
    # `fetch_wait_ms`); 0 turns long polling off.
    replica_fetch_wait_max_ms: int = 500
    # Partitions followed from one leader that get a long-polling connection of their own;
    # the rest share one connection that polls every `fetch_interval_ms`.
    replica_fetch_sessions_max: int = 32
    replica_tick_ms: int = 100  # ISR checks and high-watermark catch-up
    metadata_max_wait_ms: int = 500
    request_timeout_ms: int = 5000
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    metrics: str | None = None  # HOST:PORT for a Prometheus endpoint
    # Mutual TLS on every connection (None: plaintext, --insecure): this broker's identity
    # (`broker-<id>`) for its listener and for its clients.
    tls: TlsIdentity | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)

    def __post_init__(self) -> None:
        if self.broker_id < 0:
            raise ValueError(f"--id must be >= 0, got {self.broker_id}")
        for name in (
            "heartbeat_interval_ms",
            "session_timeout_ms",
            "flush_interval_ms",
            "replica_lag_time_max_ms",
            "fetch_interval_ms",
            "replica_fetch_sessions_max",
            "replica_tick_ms",
            "max_batch_records",
            "request_timeout_ms",
            "max_frame_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.flush_messages is not None and self.flush_messages <= 0:
            raise ValueError(f"--flush-messages must be > 0, got {self.flush_messages}")
        if self.metadata_max_wait_ms < 0:
            raise ValueError("metadata_max_wait_ms must be >= 0")
        if self.replica_fetch_wait_max_ms < 0:
            raise ValueError("replica_fetch_wait_max_ms must be >= 0")

    @property
    def fetch_wait_ms(self) -> int:
        """The max wait a follower asks for. Below half the replica lag time, as Kafka asks
        of replica.fetch.wait.max.ms: the leader records a fetch when it arrives, so a
        follower held longer than the lag time would be dropped from the ISR while idle."""
        return min(self.replica_fetch_wait_max_ms, self.fetch_hold_max_ms)

    @property
    def fetch_hold_max_ms(self) -> int:
        """The longest a leader holds a follower's fetch (and so the longest a follower
        asks for): half the replica lag time."""
        return self.replica_lag_time_max_ms // 2

    @cached_property
    def server_ssl(self) -> ssl.SSLContext | None:
        return self.tls.server_context() if self.tls is not None else None

    @cached_property
    def client_ssl(self) -> ssl.SSLContext | None:
        return self.tls.client_context() if self.tls is not None else None
