"""Metadata record types: one msgspec Struct per record, a tagged union, a version each.

Modelled on Kafka's metadata record set (metadata/src/main/resources/common/metadata),
extended where the KIP-966 documents need more than Kafka stores: a LastKnownELR *set*
rather than Kafka's single last-known leader, a reason on every partition change, and
an UncleanRecoveryRecord that keeps what each candidate reported.

Encoding is MessagePack with a ``type`` tag and defaults omitted, so a change record
carries only the fields that change. A missing ``v`` means version 1. Readers must
accept unknown *newer* fields by ignoring them (msgspec does), and the log refuses to
open a file whose schema version it does not know.

Transactions (after Kafka's KIP-868): BeginTransactionRecord, EndTransactionRecord and
AbortTransactionRecord change no state themselves; they delimit a group of records that
readers of the committed log apply all together at the end marker, or never (abort, or a
log that ends before the end marker). `metadata_image.transactions` is that reader.

On a log shared by several controllers (etcd), each new active controller writes a
ControllerChangeRecord first: who is active now, its term, and how the term before it
ended (KRaft's LeaderChangeMessage). It changes no metadata state either.

This module holds data definitions and codecs only: no IO, no rules.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Final

import msgspec

NO_LEADER: Final = -1

ELR_FEATURE: Final = "eligible.leader.replicas.version"  # level 1: KIP-966 on; 0: classic
MIN_ISR_CONFIG: Final = "min.insync.replicas"
TOPIC_RESOURCE: Final = "topic"
BROKER_RESOURCE: Final = "broker"  # with an empty name: the cluster default


class LeaderRecoveryState(IntEnum):
    RECOVERED = 0
    RECOVERING = 1  # leader chosen by unclean recovery; may have lost committed data


class ChangeReason(StrEnum):
    """Why a partition changed, so audits never have to guess."""

    CREATE = "create"
    FENCE = "fence"
    UNFENCE = "unfence"
    ALTER_PARTITION = "alter_partition"
    ELECTION = "election"
    UNCLEAN_RECOVERY = "unclean_recovery"
    CONTROLLED_SHUTDOWN = "controlled_shutdown"
    UNCLEAN_REGISTRATION = "unclean_registration"
    CLEAR_ELR = "clear_elr"
    REASSIGNMENT = "reassignment"  # replicas added, removed, or the move completed/cancelled
    UNREGISTER = "unregister"  # the broker's registration was removed (KIP-631)
    LEADER_BALANCE = "leader_balance"  # a preferred election of the automatic leader balance


class ElectionKind(StrEnum):
    """How a leader was chosen (the `kind` label of metactl_elections_total)."""

    ISR = "isr"
    ELR = "elr"
    UNCLEAN_RECOVERY = "unclean_recovery"
    PREFERRED = "preferred"
    MANUAL = "manual"


class _Record(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    omit_defaults=True,
    tag_field="type",
    gc=False,  # records hold no cycles; keeping millions of them out of the GC saves pauses
):
    v: int = 1


class TopicRecord(_Record, tag="Topic", frozen=True):
    """A topic created, or (written again with a larger `partitions`) grown.

    `min_isr` is the topic's own min.insync.replicas (None: the cluster default applies);
    a log written before topic configs existed always carries one, read as the topic's."""

    name: str
    topic_id: str
    partitions: int
    min_isr: int | None = None
    recovery_strategy: str | None = None  # None: the cluster default


class RemoveTopicRecord(_Record, tag="RemoveTopic", frozen=True):
    """The topic, all its partitions and their state are gone (DeleteTopics). Kafka's
    record names the id only; the name is kept too so that one record reads alone."""

    topic_id: str
    name: str


class ConfigRecord(_Record, tag="Config", frozen=True):
    """A dynamic config set (`value`) or deleted (None), as Kafka's ConfigRecord.

    `resource_type` is "topic" (`resource_name` the topic) or "broker" with an empty
    `resource_name`: the cluster default (kafka-configs --entity-default)."""

    resource_type: str
    resource_name: str
    name: str
    value: str | None = None


class FeatureLevelRecord(_Record, tag="FeatureLevel", frozen=True):
    """A finalized feature level (kafka-features), e.g. eligible.leader.replicas.version."""

    name: str
    level: int


class UnregisterBrokerRecord(_Record, tag="UnregisterBroker", frozen=True):
    """The broker's registration is removed (KIP-631 UnregisterBroker); the partition
    changes beside it take it out of every ISR, ELR and LastKnownELR."""

    broker_id: int
    broker_epoch: int


class PartitionRecord(_Record, tag="Partition", frozen=True):
    topic: str
    partition: int
    replicas: list[int]
    isr: list[int]
    elr: list[int] = []
    last_known_elr: list[int] = []
    leader: int = NO_LEADER
    leader_epoch: int = 0
    partition_epoch: int = 0
    recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    min_isr: int = 1
    # A reassignment in progress (KIP-455): `replicas` is target + the original replicas
    # not in the target; these are the target's new ones and the original's leaving ones.
    adding_replicas: list[int] = []
    removing_replicas: list[int] = []


class PartitionChangeRecord(_Record, tag="PartitionChange", frozen=True):
    """Only the fields that change are set; None means unchanged.

    The resulting epochs are written out rather than derived on replay, so that a
    single record can be audited on its own.
    """

    topic: str
    partition: int
    reason: ChangeReason
    partition_epoch: int
    leader_epoch: int
    election: ElectionKind | None = None  # set when `leader` names a newly elected leader
    leader: int | None = None  # NO_LEADER when the partition loses its leader
    isr: list[int] | None = None
    elr: list[int] | None = None
    last_known_elr: list[int] | None = None
    recovery_state: LeaderRecoveryState | None = None
    broker: int | None = None  # the broker whose event caused the change, if any
    # Reassignment (KIP-455): the new assignment and what is being added and removed.
    replicas: list[int] | None = None
    adding_replicas: list[int] | None = None
    removing_replicas: list[int] | None = None
    min_isr: int | None = None  # the effective MinISR, when the replication factor changed


class RegisterBrokerRecord(_Record, tag="RegisterBroker", frozen=True):
    broker_id: int
    incarnation_id: str
    broker_epoch: int  # the offset of this record
    endpoint: str = ""
    rack: str | None = None
    previous_epoch: int | None = None  # what the broker presented (None: no clean-shutdown file)
    clean: bool = False  # the controller's judgement: previous_epoch matched the last epoch
    fenced: bool = True
    kafka_endpoint: str = ""  # its Kafka listener (--kafka-listen), "" for none


class FenceBrokerRecord(_Record, tag="FenceBroker", frozen=True):
    broker_id: int
    broker_epoch: int
    reason: str = "session_timeout"


class UnfenceBrokerRecord(_Record, tag="UnfenceBroker", frozen=True):
    broker_id: int
    broker_epoch: int


class BrokerRegistrationChangeRecord(_Record, tag="BrokerRegistrationChange", frozen=True):
    broker_id: int
    broker_epoch: int
    fenced: bool | None = None
    in_controlled_shutdown: bool | None = None


class RecoveryCandidate(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """What one replica reported when its log was inspected (GetReplicaLogInfo)."""

    broker_id: int
    last_leader_epoch: int
    log_end_offset: int
    broker_epoch: int = -1


class UncleanRecoveryRecord(_Record, tag="UncleanRecovery", frozen=True):
    topic: str
    partition: int
    strategy: str
    candidates: list[RecoveryCandidate]
    chosen: int
    potential_data_loss: bool = True
    trigger: str = ""  # e.g. "isr_and_elr_empty", "elr_all_fenced", "operator"
    offline_since_ms: int | None = None
    # When the controller decided it (its clock): the image keeps each partition's last
    # recovery, so its age shows after any restart or failover. None in older logs.
    at_ms: int | None = None


CLEAR_ELR_EPOCH_VERSION: Final = 3
"""The ClearElrRecord version from which only cleared partitions get a new epoch."""


class ClearElrRecord(_Record, tag="ClearElr", frozen=True):
    """min.insync.replicas changed (KIP-966): the ELR and LastKnownELR of the topic's
    partitions [first, end) are cleared, and their effective MinISR becomes
    min(`min_isr`, replication factor).

    Kafka writes one record for a topic, or one with an empty name for all topics. Here a
    cluster-wide clear is one record per topic, and a large topic's is cut into ranges of
    a work budget each (`controller.core.work`), all inside one transaction; the record
    also carries the new configured MinISR, so that replay needs no configuration.

    Version 3 (`CLEAR_ELR_EPOCH_VERSION`, what the controller writes) bumps the partition
    epoch only of a partition whose ELR or LastKnownELR it clears, as Kafka's ClearElr
    touches only those; one whose effective MinISR alone changes keeps its epoch. Earlier
    versions bumped every partition they changed, and replay keeps that for them."""

    topic: str
    min_isr: int | None = None  # None (a log before v2): the MinISR is unchanged
    first: int = 0
    end: int | None = None  # None: to the topic's last partition


class NoOpRecord(_Record, tag="NoOp", frozen=True):
    pass


class ControllerChangeRecord(_Record, tag="ControllerChange", frozen=True):
    """A controller became the active one over a shared log (etcd, docs/ha.md): its first
    record of the term, after the abort of a transaction the previous controller left
    open, as Kafka's KRaft writes a LeaderChangeMessage at each new epoch.

    `term` is the term's fencing token (the etcd leadership key's create revision),
    larger than every earlier term's. The `previous_*` fields say how the term before
    it ended, as the leadership key's history tells it (all empty: not known, e.g. the
    log's first term): its holder and token, and why ("resigned", "lease expired",
    "dead-active detection"), by whom ("" when the holder resigned itself) and the
    holder's own reason when it resigned (e.g. "shutting down"). A single controller on
    a SQLite log writes none: it has no terms. It changes no metadata state: the
    active controller and its term are the leadership key's, not the image's."""

    node: str
    term: int
    address: str = ""  # the new active controller's advertised listener (HOST:PORT)
    previous_node: str = ""
    previous_term: int = 0
    previous_reason: str = ""
    previous_by: str = ""
    previous_detail: str = ""


class BeginTransactionRecord(_Record, tag="BeginTransaction", frozen=True):
    """The records up to the matching EndTransactionRecord take effect together (KIP-868).

    A change too large for one stored batch is written as several batches between this
    record and an EndTransactionRecord; readers apply none of it until the end marker.
    """

    name: str = ""  # what the transaction does, for people reading the log


class EndTransactionRecord(_Record, tag="EndTransaction", frozen=True):
    """The open transaction is complete: its records take effect, at this offset."""


class AbortTransactionRecord(_Record, tag="AbortTransaction", frozen=True):
    """The open transaction is abandoned: none of its records ever take effect."""

    reason: str = ""


MetadataRecord = (
    TopicRecord
    | PartitionRecord
    | PartitionChangeRecord
    | RegisterBrokerRecord
    | FenceBrokerRecord
    | UnfenceBrokerRecord
    | BrokerRegistrationChangeRecord
    | UncleanRecoveryRecord
    | ClearElrRecord
    | RemoveTopicRecord
    | ConfigRecord
    | FeatureLevelRecord
    | UnregisterBrokerRecord
    | NoOpRecord
    | BeginTransactionRecord
    | EndTransactionRecord
    | AbortTransactionRecord
    | ControllerChangeRecord
)

RECORD_TYPES: Final[dict[str, type[MetadataRecord]]] = {
    str(cls.__struct_config__.tag): cls
    for cls in (
        TopicRecord,
        PartitionRecord,
        PartitionChangeRecord,
        RegisterBrokerRecord,
        FenceBrokerRecord,
        UnfenceBrokerRecord,
        BrokerRegistrationChangeRecord,
        UncleanRecoveryRecord,
        ClearElrRecord,
        RemoveTopicRecord,
        ConfigRecord,
        FeatureLevelRecord,
        UnregisterBrokerRecord,
        NoOpRecord,
        BeginTransactionRecord,
        EndTransactionRecord,
        AbortTransactionRecord,
        ControllerChangeRecord,
    )
}

TRANSACTION_MARKERS: Final[frozenset[type[MetadataRecord]]] = frozenset(
    (BeginTransactionRecord, EndTransactionRecord, AbortTransactionRecord)
)
"""The record types that delimit a transaction rather than change state."""

MAX_BATCH_BYTES: Final = 64 * 1024 * 1024
"""Largest encoded payload of one stored batch (`encode_batch` of one append).

A change whose records encode larger is written as a transaction of several batches."""

_encoder: Final = msgspec.msgpack.Encoder()
_batch_decoder: Final = msgspec.msgpack.Decoder(list[MetadataRecord])
_one_decoder: Final = msgspec.msgpack.Decoder(MetadataRecord)


def encode_batch(records: list[MetadataRecord]) -> bytes:
    """Encode records as one MessagePack array (the payload of a stored batch)."""
    return _encoder.encode(records)


def decode_batch(payload: bytes) -> list[MetadataRecord]:
    return _batch_decoder.decode(payload)


def encode_record(record: MetadataRecord) -> bytes:
    return _encoder.encode(record)


def decode_record(payload: bytes) -> MetadataRecord:
    record: MetadataRecord = _one_decoder.decode(payload)
    return record


def record_type(record: MetadataRecord) -> str:
    return str(record.__struct_config__.tag)


def to_builtins(record: MetadataRecord) -> dict[str, object]:
    """A JSON-ready dict of the record, with its type tag and every field (defaults too)."""
    out: dict[str, object] = {"type": record_type(record)}
    for name in record.__struct_fields__:
        out[name] = msgspec.to_builtins(getattr(record, name))
    return out
