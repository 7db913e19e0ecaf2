"""The settings of one chaos run (`metactl chaos run`'s flags), checked before anything
starts: `ChaosConfig.validate` names a bad one (INVALID_REQUEST; the command reports it
as a usage error) and asks the controller's own check of the rule mode
(`ControllerConfig`). Decides nothing else.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from chaos.plan import Step
from chaos.processes import Timing
from controller.core.config import ControllerConfig
from metactl.errors import InvalidConfigurationError, InvalidRequestError

CLIENTS = ("metactl", "librdkafka")  # --client: metactl's producer, or confluent-kafka's


@dataclass(frozen=True, kw_only=True)
class ChaosConfig:
    data_dir: Path
    brokers: int = 5
    partitions: int = 6
    rf: int = 3
    min_isr: int = 2
    strategy: str = "balanced"
    eligible_leader_replicas: bool = True
    unclean_leader_election: bool = False
    lossy_kills: int = 4
    duration_s: float = 60.0
    seed: int = 0
    schedule: list[Step] | None = None  # None: a random plan from the seed
    producers: int = 3
    batch: int = 20
    operator_elect: bool = False
    heal_timeout_s: float = 60.0
    controllers: int = 1
    etcd: int = 0  # etcd members (0: the controller's SQLite log)
    base_port: int | None = None  # every port from here on (None: free ones)
    timing: Timing = field(default_factory=Timing)
    client: str = "metactl"  # who produces: metactl's own producer or librdkafka (CLIENTS)

    def validate(self) -> None:
        def bad(msg: str) -> InvalidRequestError:
            return InvalidRequestError(msg)

        if self.brokers < 1:
            raise bad(f"--brokers must be >= 1, got {self.brokers}")
        if self.partitions < 1:
            raise bad(f"--partitions must be >= 1, got {self.partitions}")
        if not 1 <= self.rf <= self.brokers:
            raise bad(f"--rf must be in 1..--brokers ({self.brokers}), got {self.rf}")
        if not 1 <= self.min_isr <= self.rf:
            raise bad(f"--min-isr must be in 1..--rf ({self.rf}), got {self.min_isr}")
        if self.lossy_kills < 0:
            raise bad(f"--lossy-kills must be >= 0, got {self.lossy_kills}")
        if self.duration_s < 0:
            raise bad(f"--duration must be >= 0, got {self.duration_s}")
        if self.producers < 1 or self.batch < 1:
            raise bad("--producers and --batch must be >= 1")
        try:  # the controller's own check of the rule mode
            ControllerConfig(
                eligible_leader_replicas=self.eligible_leader_replicas,
                unclean_leader_election=self.unclean_leader_election,
            )
        except InvalidConfigurationError as exc:
            raise InvalidConfigurationError(
                f"{exc.message} (--unclean-leader-election needs "
                "--eligible-leader-replicas disabled)"
            ) from None
        if self.operator_elect and self.strategy != "manual":
            raise bad("--operator-elect only applies to --strategy manual")
        if self.client not in CLIENTS:
            raise bad(f"--client must be one of {', '.join(CLIENTS)}, got {self.client!r}")
        if self.client == "librdkafka" and importlib.util.find_spec("confluent_kafka") is None:
            raise bad("--client librdkafka needs confluent-kafka: pip install 'metactl[test]'")
        if self.controllers < 1 or self.etcd < 0:
            raise bad("--controllers must be at least 1, --etcd at least 0")
        if self.controllers > 1 and self.etcd == 0:
            raise bad(f"{self.controllers} controllers need a shared log: add --etcd 3 (or 1)")

    @property
    def mode(self) -> str:
        if self.eligible_leader_replicas:
            return "kip-966"
        return "classic+unclean-election" if self.unclean_leader_election else "classic"
