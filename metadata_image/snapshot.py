"""The controller's snapshot form: the records that rebuild the image, and their offset.

Version 2 stores the records as a sequence of encoded batches of at most
`SNAPSHOT_BATCH_RECORDS` each (as Kafka's snapshots are a sequence of record batches),
so that loading decodes and applies one batch at a time: a million-partition image
never sits in memory beside all of its decoded records. Version 1 snapshots (one list
of records) still load.

A snapshot holds an image at a transaction boundary (the controller snapshots its
committed image, `metadata_image.transactions.LogReplay.image`), so loading one never
starts inside a transaction: the log after it is replayed through
`metadata_image.transactions`.

Data and pure conversion only: no IO.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from itertools import islice

import msgspec

from metadata_image.builder import BULK, Builder, bulk
from metadata_image.image import ClusterImage
from metadata_image.replay import apply_runs
from metadata_image.state import PartitionState
from metadata_log.records import (
    BROKER_RESOURCE,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    decode_batch,
    encode_batch,
)

SNAPSHOT_BATCH_RECORDS = 20_000


class ImageSnapshot(msgspec.Struct, frozen=True, kw_only=True, tag="ImageSnapshot"):
    v: int = 2
    end_offset: int
    records: list[MetadataRecord] = []  # version 1
    batches: list[bytes] = []  # version 2: encoded record batches, in order

    def iter_records(self) -> Iterator[MetadataRecord]:
        """The snapshot's records in order, decoding one batch at a time."""
        yield from self.records
        for payload in self.batches:
            yield from decode_batch(payload)

    def all_records(self) -> list[MetadataRecord]:
        return list(self.iter_records())


def to_snapshot(image: ClusterImage) -> ImageSnapshot:
    records = iter_image_records(image)
    batches: list[bytes] = []
    while chunk := list(islice(records, SNAPSHOT_BATCH_RECORDS)):
        batches.append(encode_batch(chunk))
    return ImageSnapshot(end_offset=image.end_offset, batches=batches)


def from_snapshot(snapshot: ImageSnapshot) -> ClusterImage:
    return image_from_records(snapshot.iter_records(), snapshot.end_offset)


def image_to_records(image: ClusterImage) -> list[MetadataRecord]:
    """The records that rebuild `image` from empty (its snapshot form, without end_offset)."""
    return list(iter_image_records(image))


def iter_image_records(image: ClusterImage) -> Iterator[MetadataRecord]:
    """`image_to_records`, one record at a time (snapshots encode it in batches)."""
    for b in sorted(image.brokers.values(), key=lambda b: b.broker_id):
        yield RegisterBrokerRecord(
            broker_id=b.broker_id,
            incarnation_id=b.incarnation_id,
            broker_epoch=b.epoch,
            endpoint=b.endpoint,
            kafka_endpoint=b.kafka_endpoint,
            rack=b.rack,
            clean=b.last_registration_clean,
            fenced=b.fenced,
        )
        if b.in_controlled_shutdown:
            yield BrokerRegistrationChangeRecord(
                broker_id=b.broker_id, broker_epoch=b.epoch, in_controlled_shutdown=True
            )
    for name, level in sorted(image.features.items()):
        yield FeatureLevelRecord(name=name, level=level)
    for name, value in sorted(image.cluster_configs.items()):
        yield ConfigRecord(resource_type=BROKER_RESOURCE, resource_name="", name=name, value=value)
    for t in sorted(image.topics.values(), key=lambda t: t.name):
        yield TopicRecord(
            name=t.name,
            topic_id=t.topic_id,
            partitions=t.partitions,
            min_isr=t.min_isr,
            recovery_strategy=t.recovery_strategy,
        )
        for p in image.partitions.of_topic(t.name, range(t.partitions)):
            yield partition_record(p)
            last = image.last_recoveries.get(p.tp)
            if last is not None:  # kept as the record itself: replay keeps it again
                yield last


def partition_record(p: PartitionState) -> PartitionRecord:
    return PartitionRecord(
        topic=p.topic,
        partition=p.partition,
        replicas=list(p.replicas),
        isr=sorted(p.isr),
        elr=sorted(p.elr),
        last_known_elr=sorted(p.last_known_elr),
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
        recovery_state=p.recovery_state,
        min_isr=p.min_isr,
        adding_replicas=list(p.adding),
        removing_replicas=list(p.removing),
    )


def image_from_records(records: Iterable[MetadataRecord], end_offset: int) -> ClusterImage:
    """Rebuild an image from snapshot records; `end_offset` is the snapshot's offset."""
    b = Builder(ClusterImage())
    # An iterator (a snapshot decoding batch by batch) is consumed as it goes, never listed.
    with bulk(len(records) if isinstance(records, Sized) else BULK):
        apply_runs(b, records)
        b.end_offset = end_offset
        return b.finish()
