"""The state types an image holds, one per broker, topic and partition, and how a partition
is named (`TopicPartition`, `tp_name`, `parse_tp`).

The bottom of the image package: the image (`metadata_image.image`) and its partition
map (`metadata_image.partition_map`) both hold these, so they live below both. Data and
read-only properties only: no rules, no IO, no imports of the package.
"""

from __future__ import annotations

from typing import Final

import msgspec

from metactl.numbers import is_digits
from metadata_log.records import NO_LEADER, LeaderRecoveryState

TopicPartition = tuple[str, int]

EMPTY: Final[frozenset[int]] = frozenset()


def tp_name(tp: TopicPartition) -> str:
    return f"{tp[0]}-{tp[1]}"


def parse_tp(name: str) -> TopicPartition:
    """Parse "orders-0" into ("orders", 0). Topic names may themselves contain dashes."""
    topic, sep, part = name.rpartition("-")
    if not sep or not topic or not is_digits(part):
        raise ValueError(f"not a partition name (expected TOPIC-N): {name!r}")
    return topic, int(part)


class BrokerState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    broker_id: int
    epoch: int
    incarnation_id: str
    endpoint: str = ""
    rack: str | None = None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    last_registration_clean: bool = True
    kafka_endpoint: str = ""  # HOST:PORT of its Kafka listener (--kafka-listen); "" for none

    @property
    def active(self) -> bool:
        """Registered, unfenced and not in controlled shutdown: eligible for leadership."""
        return not self.fenced and not self.in_controlled_shutdown


class TopicState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    name: str
    topic_id: str
    partitions: int
    min_isr: int | None = None  # the topic's min.insync.replicas; None: the cluster's
    recovery_strategy: str | None = None


class PartitionState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    topic: str
    partition: int
    # (topic, partition): made once when the partition is created and shared by every
    # later state of it, so that deltas, indexes and callers name a partition without
    # allocating a tuple (10,000 new long-lived tuples per 100,000-partition fence cost
    # the next garbage collection 3 ms).
    tp: TopicPartition
    replicas: tuple[int, ...]
    isr: frozenset[int]
    elr: frozenset[int] = EMPTY
    last_known_elr: frozenset[int] = EMPTY
    leader: int = NO_LEADER
    leader_epoch: int = 0
    partition_epoch: int = 0
    recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    min_isr: int = 1  # effective: min(topic min.insync.replicas, replication factor)
    # A reassignment in progress (KIP-455): `replicas` holds the target first, then the
    # original replicas not in it; `adding` are the target's new replicas, `removing` the
    # original ones that leave once every target replica is in the ISR.
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas the partition ends with: its replicas when not reassigning."""
        if not self.removing:
            return self.replicas
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def original(self) -> tuple[int, ...]:
        """The replicas before the reassignment (what a cancel restores)."""
        if not self.adding:
            return self.replicas
        return tuple(r for r in self.replicas if r not in self.adding)
