"""What the broker's Kafka data APIs see of the broker, and the leader-epoch answers they
share: `KafkaHost` (the replica manager, as `data`, `fetch` and `offsets` use it), a
client's current leader epoch checked against the partition's, and the end offset of an
epoch as Kafka's leader-epoch cache answers it (Fetch's diverging epoch and
OffsetForLeaderEpoch).

It must not answer an API itself (`data`, `fetch`, `offsets` do), frame bytes
(`protocol.kafka`), or change a replica.
"""

from __future__ import annotations

from typing import Final, Protocol

from brokers_stub.produce import DataPlane
from brokers_stub.replica_bytes import Chunk
from brokers_stub.replica_log import NO_EPOCH, ReplicaLog
from metactl.errors import FencedLeaderEpochError, UnknownLeaderEpochError
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition

NO_TIMESTAMP: Final = -1
UNKNOWN_OFFSET: Final = -1


class KafkaHost(Protocol):
    """What the data APIs need of the broker's replica manager."""

    data: DataPlane
    logs: dict[TopicPartition, ReplicaLog]

    @property
    def image(self) -> ClusterImage | None: ...

    def read(
        self, tp: TopicPartition, from_offset: int, end_offset: int, max_bytes: int
    ) -> list[Chunk]:
        """The replica's batches and no-bytes ranges from `from_offset` (files.read)."""
        ...


def end_offset_for_epoch(log: ReplicaLog, requested: int) -> tuple[int, int]:
    """Kafka's LeaderEpochFileCache.endOffsetFor: (the largest epoch <= `requested`, the
    offset where it ends); the newest epoch ends at the log end. (-1, -1) for -1 or an
    epoch newer than any known; an epoch older than every one known ends where the first
    known starts (Kafka's answer: nothing of it is left)."""
    history, leo = log.leader_epochs, log.log_end_offset
    if requested < 0 or not history or requested > history[-1][0]:
        return NO_EPOCH, UNKNOWN_OFFSET
    if requested == history[-1][0]:
        return requested, leo
    for i in range(len(history) - 1, -1, -1):
        epoch, _ = history[i]
        if epoch <= requested:
            return epoch, history[i + 1][1]
    return requested, history[0][1]


def check_current_epoch(current: int, leader_epoch: int) -> None:
    """A client's `current_leader_epoch` (-1: none) against the partition's."""
    current = int(current)
    if current < 0:
        return
    if current < leader_epoch:
        raise FencedLeaderEpochError(
            f"the client is at leader epoch {current}, the partition at {leader_epoch}"
        )
    if current > leader_epoch:
        raise UnknownLeaderEpochError(
            f"the client is at leader epoch {current}, this broker knows {leader_epoch}"
        )
