"""Controller settings that shape decisions (not where files live or which port to use)."""

from __future__ import annotations

import msgspec

from metactl.errors import InvalidConfigurationError


class ControllerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    unclean_recovery_strategy: str = "balanced"
    unclean_recovery_window_ms: int = 1000
    broker_session_timeout_ms: int = 9000
    broker_heartbeat_interval_ms: int = 2000
    default_min_insync_replicas: int = 1
    default_replication_factor: int = 3
    default_partitions: int = 1
    # KIP-966 on (the default) or Kafka's classic, pre-KIP-966 rules for comparison: no ELR
    # or LastKnownELR, the last ISR member stays in the ISR when fenced, and clean
    # election is from the ISR only.
    eligible_leader_replicas: bool = True
    # Classic mode only: Kafka's unclean.leader.election.enable. Any live replica may be
    # elected without log inspection; each such election is a potential data-loss event.
    unclean_leader_election: bool = False

    def __post_init__(self) -> None:
        if self.unclean_leader_election and self.eligible_leader_replicas:
            raise InvalidConfigurationError(
                "unclean leader election is a classic-mode setting: with eligible leader "
                "replicas enabled, unclean recovery strategies replace it"
            )
