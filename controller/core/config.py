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
    # Automatic preferred-leader balance (controller.core.leader_balance), with Kafka's
    # names and defaults: on; a check an interval after leadership leaves a preferred
    # replica; elections for the brokers that lead less than (100 - percentage)% of the
    # partitions they are preferred for.
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_seconds: int = 300
    leader_imbalance_per_broker_percentage: int = 10

    def __post_init__(self) -> None:
        if self.leader_imbalance_check_interval_seconds < 1:
            raise InvalidConfigurationError(
                "leader.imbalance.check.interval.seconds must be at least 1, got "
                f"{self.leader_imbalance_check_interval_seconds}"
            )
        if not 0 <= self.leader_imbalance_per_broker_percentage <= 100:
            raise InvalidConfigurationError(
                "leader.imbalance.per.broker.percentage must be 0 to 100, got "
                f"{self.leader_imbalance_per_broker_percentage}"
            )
        if self.unclean_leader_election and self.eligible_leader_replicas:
            raise InvalidConfigurationError(
                "unclean leader election is a classic-mode setting: with eligible leader "
                "replicas enabled, unclean recovery strategies replace it"
            )
