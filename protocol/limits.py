"""The bounds on every connection a listener holds, and the counters that report them.

`ServerLimits` is what the processes' connection-limit flags set (`protocol.flags`);
`ServerStats` counts what the limits did (the metrics read it; no listener exports
anything itself); `fit_descriptor_limit` lowers the caps to the process's
file-descriptor limit. Shared by every listener: the frame server's admission today,
and any listener with framing of its own (`protocol.admission`).

Data and one pure function: no sockets, no event loop.
"""

from __future__ import annotations

import dataclasses
import resource
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from protocol.rate_limited_log import Logger

DEFAULT_MAX_CONNECTIONS: Final = 1000
DEFAULT_MAX_CONNECTIONS_PER_PEER: Final = 200
DEFAULT_MAX_PENDING_HANDSHAKES: Final = 1024
DEFAULT_MAX_PENDING_HANDSHAKES_PER_ADDRESS: Final = 256
DEFAULT_MAX_HANDSHAKES_IN_PROGRESS: Final = 64
DEFAULT_MAX_PARKED_HANDSHAKES: Final = 8192
DEFAULT_IDLE_TIMEOUT_S: Final = 600.0  # Kafka's connections.max.idle.ms
DEFAULT_FRAME_DEADLINE_S: Final = 30.0
DEFAULT_HANDSHAKE_TIMEOUT_S: Final = 10.0
FD_RESERVE: Final = 64  # descriptors kept for the log, outgoing clients and listeners
CLUSTER_FD_RESERVE: Final = 256  # at most this many kept for the cluster's own sessions


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    frame_deadline_s: float = DEFAULT_FRAME_DEADLINE_S
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_pending_handshakes: int = DEFAULT_MAX_PENDING_HANDSHAKES
    max_pending_handshakes_per_address: int = DEFAULT_MAX_PENDING_HANDSHAKES_PER_ADDRESS
    max_handshakes_in_progress: int = DEFAULT_MAX_HANDSHAKES_IN_PROGRESS
    # Dropped pending connections held open (nothing read or sent) until their handshake
    # deadline rather than closed; 0: every drop closes at once.
    max_parked_handshakes: int = DEFAULT_MAX_PARKED_HANDSHAKES

    def __post_init__(self) -> None:
        counts = (
            self.max_connections,
            self.max_connections_per_peer,
            self.max_pending_handshakes,
            self.max_pending_handshakes_per_address,
            self.max_handshakes_in_progress,
        )
        if (
            min(counts) < 1
            or self.max_parked_handshakes < 0
            or (min(self.idle_timeout_s, self.frame_deadline_s, self.handshake_timeout_s) <= 0)
        ):
            raise ValueError(f"invalid server limits {self}")


@dataclass
class ServerStats:
    """Counters a metrics module reads (the server itself exports nothing)."""

    open_connections: int = 0  # established, clients' and the cluster's
    cluster_connections: int = 0  # established by `controller` and `broker-<id>`
    pending_handshakes: int = 0  # accepted under TLS, not yet authenticated
    accepted_total: int = 0
    # Connections whose TLS handshake began (a ClientHello arrived), so that TLS state
    # was allocated; a pending connection that never speaks never counts here.
    handshakes_started_total: int = 0
    # reason -> count. Established pool: "max_connections", "max_connections_per_peer",
    # "idle_timeout", "frame_deadline", "oversized_frame", "truncated_frame". Pending
    # pool, dropped to make room: "max_pending_handshakes",
    # "max_pending_handshakes_per_address", "max_handshakes_in_progress"; and
    # "handshake_timeout", "handshake_failed", "not_tls" (its first byte opens no TLS
    # handshake), "no_handshake" (closed before speaking), "no_principal".
    # "accept_error": accept() failed. A connection dropped from the pending pool counts
    # once, under its reason, whether it is closed at once or parked (closed later).
    closed_total: Counter[str] = field(default_factory=Counter)
    bad_frames_total: int = 0
    parked_handshakes: int = 0  # dropped pending connections held open now (`_park`)
    parked_total: int = 0  # dropped pending connections parked rather than closed
    parked_closed_early_total: int = 0  # parked ones closed before their deadline for room


def fit_descriptor_limit(limits: ServerLimits, log: Logger) -> ServerLimits:
    """The caps kept below the process's file-descriptor limit, with room for the log,
    clients and listeners and for the cluster's own sessions, so a flood meets the
    server's own caps (closed and counted) rather than EMFILE at accept()."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):  # pragma: no cover - every POSIX has it
        return limits
    if soft == resource.RLIM_INFINITY:
        return limits
    room = max(2, soft - FD_RESERVE)
    budget = max(2, room - min(room // 4, CLUSTER_FD_RESERVE))
    held = limits.max_connections + limits.max_pending_handshakes
    if held + limits.max_parked_handshakes <= budget:
        return limits
    if held <= budget:  # parking (the cheapest to give up) takes what is left
        log.info(
            "max parked handshakes lowered to fit the file-descriptor limit",
            configured=limits.max_parked_handshakes,
            effective=budget - held,
            nofile=soft,
        )
        return dataclasses.replace(limits, max_parked_handshakes=budget - held)
    pending = max(1, min(limits.max_pending_handshakes, budget // 4))
    connections = max(1, min(limits.max_connections, budget - pending))
    log.warning(
        "max connections lowered to fit the file-descriptor limit",
        configured=limits.max_connections,
        effective=connections,
        pending_configured=limits.max_pending_handshakes,
        pending_effective=pending,
        nofile=soft,
    )
    return dataclasses.replace(
        limits,
        max_connections=connections,
        max_connections_per_peer=min(connections, limits.max_connections_per_peer),
        max_pending_handshakes=pending,
        max_pending_handshakes_per_address=min(pending, limits.max_pending_handshakes_per_address),
        max_handshakes_in_progress=min(pending, limits.max_handshakes_in_progress),
        max_parked_handshakes=0,
    )
