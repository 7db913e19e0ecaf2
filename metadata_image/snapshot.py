"""The controller's snapshot form: the records that rebuild the image, and their offset."""

from __future__ import annotations

import msgspec

from metadata_image.image import ClusterImage
from metadata_image.replay import image_from_records, image_to_records
from metadata_log.records import MetadataRecord


class ImageSnapshot(msgspec.Struct, frozen=True, kw_only=True, tag="ImageSnapshot"):
    v: int = 1
    end_offset: int
    records: list[MetadataRecord]


def to_snapshot(image: ClusterImage) -> ImageSnapshot:
    return ImageSnapshot(end_offset=image.end_offset, records=image_to_records(image))


def from_snapshot(snapshot: ImageSnapshot) -> ClusterImage:
    return image_from_records(snapshot.records, snapshot.end_offset)
