"""The messages between brokers and the controller: a broker's registration, heartbeats
and AlterPartition, its metadata fetch (the log tail or a snapshot), and the controller's
GetReplicaLogInfo to a broker (unclean recovery's log inspection) and its answer.

Data only: no IO, no rules.
"""

from __future__ import annotations

import msgspec

from metadata_log.records import MetadataRecord
from protocol.messages.base import Msg


class RegisterBroker(Msg, tag="BrokerRegistration", frozen=True):
    broker_id: int
    incarnation_id: str
    # From the clean-shutdown file; None after a crash.
    previous_epoch: int | None = msgspec.field(default=None, name="previous_broker_epoch")
    endpoint: str = ""  # host:port where the broker answers GetReplicaLogInfo
    rack: str | None = None
    # host:port of the broker's Kafka listener (--kafka-listen; "" for none): what Kafka
    # clients are told in Metadata. An older controller ignores it.
    kafka_endpoint: str = ""


class RegisterBrokerResponse(Msg, tag="BrokerRegistrationResponse", frozen=True):
    broker_epoch: int
    clean: bool


class BrokerHeartbeatRequest(Msg, tag="BrokerHeartbeat", frozen=True):
    broker_id: int
    broker_epoch: int
    metadata_offset: int  # the broker has applied every record below this offset
    want_fence: bool = False
    want_shutdown: bool = False


class BrokerHeartbeatResponse(Msg, tag="BrokerHeartbeatResponse", frozen=True):
    is_fenced: bool
    in_controlled_shutdown: bool
    should_shut_down: bool  # controlled shutdown done: the broker leads nothing


class IsrMember(msgspec.Struct, frozen=True, kw_only=True):
    broker_id: int
    broker_epoch: int


class AlterPartition(Msg, tag="AlterPartition", frozen=True):
    topic: str
    partition: int
    leader: int
    broker_epoch: int  # the sender's
    partition_epoch: int
    isr: list[IsrMember]
    leader_epoch: int | None = None
    recovered: bool = True  # the leader has finished recovering after an unclean election


class AlterPartitions(Msg, tag="AlterPartitions", frozen=True):
    """Many partitions' AlterPartition from one leader in one request, as Kafka's
    AlterPartition request carries every partition a broker has queued. Each item is
    decided and answered on its own; the controller works through them a work budget of
    items per event, each piece committed on its own (docs/protocol.md)."""

    items: list[AlterPartition]


class PartitionView(Msg, tag="PartitionView", frozen=True):
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: list[int]


class AlterPartitionResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One item's outcome: its partition's state once the change is committed (`view`),
    or the error that refused it."""

    topic: str
    partition: int
    error_code: str | None = None
    message: str = ""
    view: PartitionView | None = None


class AlterPartitionsResponse(Msg, tag="AlterPartitionsResponse", frozen=True):
    results: list[AlterPartitionResult]  # in the order of the request's items


class FetchMetadataRequest(Msg, tag="FetchMetadata", frozen=True):
    from_offset: int
    max_records: int = 10_000
    max_wait_ms: int = 500


class FetchedRecord(msgspec.Struct, frozen=True, array_like=True):
    offset: int
    timestamp_ms: int
    record: MetadataRecord


class MetadataSnapshot(msgspec.Struct, frozen=True):
    offset: int  # the snapshot holds the state of every record below this offset
    records: list[MetadataRecord]


class FetchMetadataResponse(Msg, tag="FetchMetadataResponse", frozen=True):
    records: list[FetchedRecord]
    end_offset: int  # committed end offset at the time of the answer
    snapshot: MetadataSnapshot | None = None


# --- controller -> broker ---------------------------------------------------------------


class ReplicaRef(msgspec.Struct, frozen=True, array_like=True):
    topic: str
    partition: int


class GetReplicaLogInfoRequest(Msg, tag="GetReplicaLogInfo", frozen=True):
    broker_id: int
    broker_epoch: int  # the epoch the controller knows; a broker at another epoch refuses
    partitions: list[ReplicaRef]


class ReplicaLogInfoEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    topic: str
    partition: int
    last_leader_epoch: int = -1
    log_end_offset: int = 0
    error_code: str | None = None


class GetReplicaLogInfoResponse(Msg, tag="GetReplicaLogInfoResponse", frozen=True):
    broker_id: int
    broker_epoch: int
    partitions: list[ReplicaLogInfoEntry]
