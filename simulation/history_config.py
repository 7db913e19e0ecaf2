"""What ``metactl simulate history`` is asked for and what it reports, and its time syntax.

This module owns the simulator's inputs and outputs: `HistoryConfig` (sizes, seed, start
time and the event rates), `SimulationReport` (what was written, and what happened), the
time constants they share with the simulation loop, and `parse_time_ms`, the
time syntax of the CLI's ``--start``, ``--since`` and ``--until``.

It does not simulate: no controller core, no log store, no randomness and no IO here
(the loop is `simulation.history`), so the CLI and the export can parse times without
importing the controller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from metactl.numbers import INT64_MAX, INT64_MIN, kafka_int

__all__ = [
    "DAY_MS",
    "DEFAULT_START",
    "MINUTE_MS",
    "HistoryConfig",
    "SimulationReport",
    "parse_time_ms",
]

DAY_MS: Final = 86_400_000
MINUTE_MS: Final = 60_000
DEFAULT_START: Final = "2026-01-01T00:00:00Z"


@dataclass(frozen=True)
class HistoryConfig:
    brokers: int = 30
    partitions: int = 5000
    days: float = 30.0
    seed: int = 0
    topics: int | None = None  # default: one per 100 partitions
    replication_factor: int = 3
    min_isr: int = 2
    strategy: str = "balanced"
    start_ms: int = int(datetime.fromisoformat(DEFAULT_START).timestamp() * 1000)
    intensity: float = 1.0  # scales every event rate
    # Events per broker per day (scaled by intensity).
    controlled_restarts: float = 1.0
    crashes: float = 0.5
    blips: float = 1.0
    # Cluster-wide events per day.
    outages: float = 0.15
    shrinks_per_partition: float = 0.2


@dataclass
class SimulationReport:
    path: str
    records: int = 0
    batches: int = 0
    elapsed_s: float = 0.0
    events: dict[str, int] = field(default_factory=dict)
    unclean_recoveries: int = 0
    refused: int = 0
    offline_at_end: int = 0

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def lines(self) -> list[str]:
        events = ", ".join(f"{k}={v}" for k, v in sorted(self.events.items()))
        return [
            f"wrote {self.records:,} records in {self.batches:,} batches to {self.path}",
            f"{self.elapsed_s:.1f} s, {self.records_per_s:,.0f} records/s",
            f"events: {events}",
            f"unclean recoveries: {self.unclean_recoveries}, refused requests: {self.refused}, "
            f"partitions offline at the end: {self.offline_at_end}",
        ]


_EPOCH_MS: Final = re.compile(r"[+-]?[0-9]+", re.ASCII)


def parse_time_ms(text: str) -> int:
    """An ISO 8601 date or time (UTC unless it says otherwise) or epoch milliseconds."""
    text = text.strip()
    if _EPOCH_MS.fullmatch(text):
        return kafka_int(text, INT64_MIN, INT64_MAX)  # epoch ms: as Kafka's parseLong
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)
