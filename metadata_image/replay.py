"""Replay: the only place where cluster state changes.

`apply(image, records)` applies committed (or, in the driver, about-to-be-committed)
records to an image and returns the next image and a `MetadataDelta` naming what
changed; `replay` is the same without the delta (restart, snapshots, tests). The
controller runs exactly this code on every change and again on restart, from the newest
snapshot plus the log after it; the brokers and the audits replay with it too.
`metadata_image.snapshot.image_to_records` is the inverse used for snapshots: replaying
its output onto an empty image gives an equal image.

This module owns the order of replay: records applied in runs of one type, partition
runs through the builder's bulk paths (`metadata_image.builder`), every other record
through its function in `metadata_image.record_replay` (`_APPLY`, dispatched on the
record's exact type).

Transaction markers (Begin/End/AbortTransactionRecord) are no-ops here that only advance
`end_offset`: this is the replay of records known to take effect (the controller's
working image, whole transactions). Whoever reads the *committed log*, where a
transaction may still be open or was aborted, replays through
`metadata_image.transactions`, which holds a transaction back until its end marker.

Replay trusts its input to be a log the controller wrote; it raises `ReplayError` on a
record that contradicts the image (unknown partition, unknown broker) rather than
guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import groupby
from typing import Any, cast

from metactl.errors import ReplayError
from metadata_image import record_replay as records
from metadata_image.builder import Builder, bulk
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_log.records import (
    RECORD_TYPES,
    AbortTransactionRecord,
    BeginTransactionRecord,
    BrokerRegistrationChangeRecord,
    ClearElrRecord,
    ConfigRecord,
    ControllerChangeRecord,
    EndTransactionRecord,
    FeatureLevelRecord,
    FenceBrokerRecord,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)

_TAGS: dict[type, str] = {cls: tag for tag, cls in RECORD_TYPES.items()}

# Dispatch on the exact type: isinstance against a msgspec Struct class costs about half a
# microsecond, so a `match` over eleven record classes dominated bulk replay.
_APPLY: dict[type, Callable[[Builder, Any], None]] = {
    PartitionChangeRecord: records.partition_change,
    FenceBrokerRecord: records.fence,
    UnfenceBrokerRecord: records.unfence,
    BrokerRegistrationChangeRecord: records.registration_change,
    RegisterBrokerRecord: records.register,
    PartitionRecord: records.partition,
    TopicRecord: records.topic,
    ClearElrRecord: records.clear_elr,
    RemoveTopicRecord: records.remove_topic,
    ConfigRecord: records.config,
    FeatureLevelRecord: records.feature,
    UnregisterBrokerRecord: records.unregister,
    UncleanRecoveryRecord: records.unclean_recovery,
    NoOpRecord: records.noop,
    BeginTransactionRecord: records.noop,
    EndTransactionRecord: records.noop,
    AbortTransactionRecord: records.noop,
    ControllerChangeRecord: records.controller_change,
}


def _apply_record(builder: Builder, record: MetadataRecord) -> None:
    handler = _APPLY.get(type(record)) or _handler_for(type(record))
    handler(builder, record)


def _handler_for(kind: type) -> Callable[[Builder, Any], None]:
    """The handler of the nearest record class `kind` derives from (a subclass replays as
    its base did under isinstance dispatch); refuses anything else."""
    for base in kind.__mro__:
        handler = _APPLY.get(base)
        if handler is not None:
            _APPLY[kind] = handler
            return handler
    raise ReplayError(f"cannot replay a {kind.__name__}")


def replay(image: ClusterImage, records: Iterable[MetadataRecord]) -> ClusterImage:
    """Apply records in order; each advances `end_offset` by one."""
    return _replay(image, records, None)


def apply(
    image: ClusterImage, records: Iterable[MetadataRecord]
) -> tuple[ClusterImage, MetadataDelta]:
    """`replay`, and the delta that says what the records changed."""
    delta = MetadataDelta()
    return _replay(image, records, delta), delta


def _replay(
    image: ClusterImage, records: Iterable[MetadataRecord], delta: MetadataDelta | None
) -> ClusterImage:
    b = Builder(image, delta)
    batch = records if isinstance(records, list) else list(records)
    with bulk(len(batch)):
        counts = None if delta is None else delta.records_by_type
        apply_runs(b, batch, counts)
        b.end_offset += len(batch)
        return b.finish()


def apply_runs(
    b: Builder, records: Iterable[MetadataRecord], counts: dict[str, int] | None = None
) -> None:
    """Apply records in runs of one type: partition records and changes (thousands in a
    row in a create, a fence or a snapshot) take their bulk loops, the rest one by one.
    Consumes an iterator as it goes. `counts` (record type tag -> records), when given,
    is added what was applied, a run at a time (a `Counter` over the batch's types cost
    about 3% of a 100,000-partition fence's steps)."""
    for kind, group in groupby(records, type):
        run: Iterable[MetadataRecord]
        if counts is None:
            run = group
        else:
            run = listed = list(group)
            tag = _TAGS[kind]
            counts[tag] = counts.get(tag, 0) + len(listed)
        if kind is PartitionChangeRecord:
            b.partition_changes(cast("Iterator[PartitionChangeRecord]", run))
        elif kind is PartitionRecord:
            b.partition_records(cast("Iterator[PartitionRecord]", run))
        else:
            for record in run:
                _apply_record(b, record)
