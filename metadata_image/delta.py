"""MetadataDelta: what one replay changed, in the spirit of Kafka's MetadataDelta.

`metadata_image.replay.apply` fills one while it applies records, so that everyone
downstream (recovery evaluation, metrics, the scenario runner's events, the simulators,
the brokers' replica managers) acts on exactly what changed instead of recomputing it
from the records or rescanning the image. A delta names what changed; the image after
the replay holds the new state.

Data only: no rules, no IO.
"""

from __future__ import annotations

import msgspec

from metadata_image.state import TopicPartition
from metadata_log.records import ControllerChangeRecord, ElectionKind, UncleanRecoveryRecord


class Election(msgspec.Struct, frozen=True, gc=False):
    """A leader chosen for a partition (a PartitionChangeRecord with `election` set)."""

    tp: TopicPartition
    leader: int
    kind: ElectionKind


class MetadataDelta:
    """The changes of one or more consecutive replays (merge them with `update`)."""

    __slots__ = (
        "brokers",
        "configs",
        "controller_changes",
        "elections",
        "features",
        "partitions",
        "records_by_type",
        "removed_topics",
        "topics",
        "unclean_recoveries",
        "unclean_registrations",
        "unregistered",
    )

    def __init__(self) -> None:
        # Brokers registered, fenced, unfenced or entering controlled shutdown.
        self.brokers: set[int] = set()
        # Topics created or grown.
        self.topics: set[str] = set()
        # Topics deleted: name -> (topic id, partition count). A topic deleted and then
        # created again within one delta is in both `removed_topics` and `topics`.
        self.removed_topics: dict[str, tuple[str, int]] = {}
        # Brokers unregistered (they are no longer in the image).
        self.unregistered: set[int] = set()
        # Dynamic configs set or deleted: (resource type, resource name, config name).
        self.configs: set[tuple[str, str, str]] = set()
        # Feature levels finalized.
        self.features: set[str] = set()
        # Partitions created or changed.
        self.partitions: set[TopicPartition] = set()
        self.elections: list[Election] = []
        self.unclean_recoveries: list[UncleanRecoveryRecord] = []
        # Brokers whose registration the controller judged unclean, in log order.
        self.unclean_registrations: list[int] = []
        # New active controllers on a shared log (etcd), in log order.
        self.controller_changes: list[ControllerChangeRecord] = []
        # Record type tag -> count.
        self.records_by_type: dict[str, int] = {}

    @property
    def empty(self) -> bool:
        return not self.records_by_type

    @property
    def record_count(self) -> int:
        return sum(self.records_by_type.values())

    def update(self, other: MetadataDelta) -> MetadataDelta:
        """Fold `other` (a later replay) into this delta; returns self."""
        self.brokers |= other.brokers
        if other.removed_topics:  # what this delta created or changed of them is gone
            gone = other.removed_topics
            self.topics -= gone.keys()
            self.partitions = {tp for tp in self.partitions if tp[0] not in gone}
        self.topics |= other.topics
        self.removed_topics.update(other.removed_topics)
        self.unregistered |= other.unregistered
        self.configs |= other.configs
        self.features |= other.features
        self.partitions |= other.partitions
        self.elections.extend(other.elections)
        self.unclean_recoveries.extend(other.unclean_recoveries)
        self.unclean_registrations.extend(other.unclean_registrations)
        self.controller_changes.extend(other.controller_changes)
        for kind, n in other.records_by_type.items():
            self.records_by_type[kind] = self.records_by_type.get(kind, 0) + n
        return self

    def __repr__(self) -> str:
        return (
            f"MetadataDelta(brokers={sorted(self.brokers)}, topics={sorted(self.topics)}, "
            f"partitions={len(self.partitions)}, elections={len(self.elections)}, "
            f"unclean_recoveries={len(self.unclean_recoveries)}, "
            f"records={self.records_by_type})"
        )
