"""The stored form of the metadata log: batches, snapshots, their CRCs and their checks.

This module owns what a backend stores and how it is checked and decoded: `StoredBatch`
and `StoredSnapshot`, the CRC over each (`batch_crc`, `snapshot_crc`), the checks that
name the first bad offset (`check_batch`, `check_batch_frame`, `check_continuity`, and
`check_tail`, what every backend checks at open), the
replay hot path that turns stored batches into `LogEntry` values (`decode_entries`), and
how payloads of `records.encode_batch` join into one (`concat_batches`). The layout and
CRC scope are described in `metadata_log.store`.

It is pure: it must not do IO, hold state, know a storage medium or the store's
semantics (offset assignment, group commit, visibility), or interpret records.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from itertools import repeat
from typing import Final

import msgspec

from metactl.errors import CorruptLogError
from metadata_log.records import MetadataRecord, decode_batch

__all__ = [
    "TAIL_CHECK_BATCHES",
    "LogEntry",
    "StoredBatch",
    "StoredSnapshot",
    "batch_crc",
    "check_batch",
    "check_batch_frame",
    "check_continuity",
    "check_tail",
    "concat_batches",
    "decode_entries",
    "snapshot_crc",
]

TAIL_CHECK_BATCHES: Final = 64
"""Opening a log checks its last this many batches (etcd: group keys), `check_tail`."""

_BATCH_HEADER: Final = struct.Struct(">qiq")  # base_offset, record_count, timestamp_ms
_SNAPSHOT_HEADER: Final = struct.Struct(">qq")  # offset, timestamp_ms


_INT32_MAX: Final = 2**31 - 1
_INT64: Final = range(-(2**63), 2**63)


def batch_crc(base_offset: int, count: int, timestamp_ms: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(_BATCH_HEADER.pack(base_offset, count, timestamp_ms)))


def _header_fits(batch: StoredBatch) -> bool:
    """The header's fields fit their stored widths (a crafted file may say otherwise)."""
    return (
        1 <= batch.count <= _INT32_MAX
        and batch.base_offset in _INT64
        and batch.timestamp_ms in _INT64
    )


def snapshot_crc(offset: int, timestamp_ms: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(_SNAPSHOT_HEADER.pack(offset, timestamp_ms)))


class LogEntry(msgspec.Struct, frozen=True, gc=False):
    """One committed record and where it sits in the log.

    Not tracked by the cycle collector (``gc=False``): it cannot form cycles, and replaying
    millions of entries would otherwise trigger collections that cost more than decoding.
    """

    offset: int
    timestamp_ms: int
    crc: int  # CRC of the stored batch holding this record
    record: MetadataRecord


class StoredBatch(msgspec.Struct, frozen=True, gc=False):
    """A batch as a backend stores it: the unit of atomicity, CRC and storage."""

    base_offset: int
    count: int
    timestamp_ms: int
    crc: int
    payload: bytes

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count


class StoredSnapshot(msgspec.Struct, frozen=True, gc=False):
    offset: int
    timestamp_ms: int
    crc: int
    payload: bytes


def check_batch(batch: StoredBatch, location: str) -> list[MetadataRecord]:
    """Check one stored batch's CRC and decodability; return its records."""
    _check_crc(batch, location)
    try:
        records = decode_batch(batch.payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptLogError(
            f"batch does not decode: {exc}", path=location, offset=batch.base_offset
        ) from exc
    if len(records) != batch.count:
        raise CorruptLogError(
            f"batch header says {batch.count} records, payload holds {len(records)}",
            path=location,
            offset=batch.base_offset,
        )
    return records


def check_batch_frame(batch: StoredBatch, location: str) -> None:
    """Check one stored batch without decoding its records: its CRC, and that its payload is
    a MessagePack array of as many elements as the batch header says.

    The CRC covers the header and every payload byte, so this finds any damage done to the
    batch after it was written, for a few percent of the cost of decoding it. What it cannot
    find is a payload *written* wrong under a valid CRC (a writer bug), except a wrong
    record count, the mistake merging a group commit's payloads could make: `check_batch`
    and `decode_entries` still find the rest, with the same error, when the batch is read.
    """
    _check_crc(batch, location)
    length = _msgpack_array_length(batch.payload)
    if length is None:
        raise CorruptLogError(
            "batch payload is not a MessagePack array", path=location, offset=batch.base_offset
        )
    if length != batch.count:
        raise CorruptLogError(
            f"batch header says {batch.count} records, payload holds {length}",
            path=location,
            offset=batch.base_offset,
        )


def _check_crc(batch: StoredBatch, location: str) -> None:
    if not _header_fits(batch):
        raise CorruptLogError(
            f"batch header out of range: {batch.count} records at offset "
            f"{batch.base_offset}, timestamp {batch.timestamp_ms}",
            path=location,
            offset=batch.base_offset if batch.base_offset in _INT64 else None,
        )
    if batch_crc(batch.base_offset, batch.count, batch.timestamp_ms, batch.payload) != batch.crc:
        raise CorruptLogError("batch CRC mismatch", path=location, offset=batch.base_offset)


def check_continuity(batches: Sequence[StoredBatch], expected: int, location: str) -> int:
    """Check that `batches` start at `expected` and follow each other without gaps or overlaps.

    Returns the offset after the last batch.
    """
    for batch in batches:
        if batch.base_offset != expected:
            kind = "gap" if batch.base_offset > expected else "overlap"
            raise CorruptLogError(
                f"offset {kind}: expected a batch at {expected}, found one at {batch.base_offset}",
                path=location,
                offset=min(expected, batch.base_offset),
            )
        expected = batch.end_offset
    return expected


def check_tail(
    batches: Sequence[StoredBatch], start: int, end: int, location: str, *, whole: bool
) -> None:
    """The check at open of a log's last batches, read back from its end offset `end`:
    they follow each other up to `end`, and each one's CRC and framing hold
    (`check_batch_frame`: not decoded). `whole` says they are every batch the log holds
    (fewer than `TAIL_CHECK_BATCHES` were found), so they must also begin at `start`."""
    if not batches:
        if end != start:
            raise CorruptLogError("log holds no batch", path=location, offset=start)
        return
    first = start if whole else batches[0].base_offset
    if check_continuity(batches, first, location) != end:
        raise CorruptLogError("log tail does not end at its end offset", path=location, offset=end)
    for batch in batches:
        check_batch_frame(batch, location)


def decode_entries(
    batches: Sequence[StoredBatch], lo: int, hi: int, location: str
) -> list[LogEntry]:
    """Check and decode contiguous `batches` into the entries with offsets in [lo, hi).

    This is the replay hot path: per batch it does the checks of `check_continuity` and
    `check_batch` inline, falling back to them only to build the error.
    """
    out: list[LogEntry] = []
    append = out.append
    pack = _BATCH_HEADER.pack
    crc32 = zlib.crc32
    expected = batches[0].base_offset if batches else lo
    for stored in batches:
        base = stored.base_offset
        count = stored.count
        timestamp_ms = stored.timestamp_ms
        crc = stored.crc
        payload = stored.payload
        if base != expected:
            check_continuity([stored], expected, location)
        try:  # (zero-cost unless raised: a header too wide to pack is a crafted one)
            if (
                not 1 <= count <= _INT32_MAX
                or crc32(payload, crc32(pack(base, count, timestamp_ms))) != crc
            ):
                check_batch(stored, location)
        except struct.error:
            check_batch(stored, location)
        expected = base + count
        try:
            records = decode_batch(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            records = check_batch(stored, location)
        if len(records) != count:
            check_batch(stored, location)
        if count == 1:
            if lo <= base < hi:
                append(LogEntry(base, timestamp_ms, crc, records[0]))
            continue
        first = lo - base if lo > base else 0
        last = hi - base if hi - base < count else count
        if first < last:
            n = last - first
            out.extend(
                map(
                    LogEntry,
                    range(base + first, base + last),
                    repeat(timestamp_ms, n),
                    repeat(crc, n),
                    records if n == count else records[first:last],
                )
            )
    return out


def concat_batches(payloads: Sequence[bytes], count: int) -> bytes:
    """Join payloads of `records.encode_batch` into one, as if the records were encoded together.

    A payload is a MessagePack array: a header giving its length, then the elements. The
    merged payload is a header for `count` elements followed by every payload's elements.
    """
    if len(payloads) == 1 and _msgpack_array_length(payloads[0]) == count:
        return payloads[0]  # already one array of them: no copy
    parts: list[bytes | memoryview] = [_msgpack_array_header(count)]
    for payload in payloads:
        head = payload[0]
        if head & 0xF0 == 0x90:  # fixarray
            skip = 1
        elif head == 0xDC:  # array 16
            skip = 3
        elif head == 0xDD:  # array 32
            skip = 5
        else:
            raise ValueError(f"not a MessagePack array (first byte {head:#x})")
        parts.append(memoryview(payload)[skip:])
    return b"".join(parts)


def _msgpack_array_header(count: int) -> bytes:
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _msgpack_array_length(payload: bytes) -> int | None:
    """The element count in the MessagePack array header of `payload`, or None if none."""
    if not payload:
        return None
    head = payload[0]
    if head & 0xF0 == 0x90:  # fixarray
        return head & 0x0F
    if head == 0xDC and len(payload) >= 3:  # array 16
        return int.from_bytes(payload[1:3], "big")
    if head == 0xDD and len(payload) >= 5:  # array 32
        return int.from_bytes(payload[1:5], "big")
    return None
