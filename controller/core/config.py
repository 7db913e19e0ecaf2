"""Controller settings that shape decisions (not where files live or which port to use)."""

from __future__ import annotations

import msgspec


class ControllerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    unclean_recovery_strategy: str = "balanced"
    unclean_recovery_window_ms: int = 1000
    broker_session_timeout_ms: int = 9000
    broker_heartbeat_interval_ms: int = 2000
    default_min_insync_replicas: int = 1
    default_replication_factor: int = 3
    default_partitions: int = 1
