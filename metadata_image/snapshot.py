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

from collections.abc import Iterator
from itertools import islice

import msgspec

from metadata_image.image import ClusterImage
from metadata_image.replay import image_from_records, iter_image_records
from metadata_log.records import MetadataRecord, decode_batch, encode_batch

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
