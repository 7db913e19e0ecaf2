"""Kafka record batches (magic 2), as they travel in Produce and Fetch: pure functions on
bytes.

A batch's 61-byte header (Kafka's DefaultRecordBatch), big-endian:

    0 baseOffset int64 | 8 batchLength int32 | 12 partitionLeaderEpoch int32 | 16 magic int8
    17 crc uint32 (CRC-32C of bytes 21..end) | 21 attributes int16 | 23 lastOffsetDelta int32
    27 baseTimestamp int64 | 35 maxTimestamp int64 | 43 producerId int64
    51 producerEpoch int16 | 53 baseSequence int32 | 57 recordsCount int32 | 61 records

The base offset and the partition leader epoch lie outside the CRC: the leader sets them
on append without touching the rest, so a batch is stored as it came.

The leader's path: `validate_produce_records` (Kafka's checks of a client's batch, each
refusal with Kafka's code), the producer state's `check`, `stamp`, then store the bytes.
`null_records_batch` stands for offsets metactl's native producer wrote (no bytes kept);
`offset_for_timestamp` answers ListOffsets by time; `iter_batches` walks stored batches.
Records are read with kio's varint readers, not kio's batch reader: that one turns each
timestamp into a datetime (whole seconds, refusing years past 9999, which Kafka accepts)
and builds an object per record. The Produce check (`_check_records`) decodes the one-
and two-byte varints inline, builds nothing per record and copies no bytes: it is most
of the leader's work on a client's batch (about 0.6 µs a record); `_records`, the same
reading as a generator, serves ListOffsets. `stamp` copies a batch once.

This module owns the batch layout. It must do no IO.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from crc32c import crc32c
from kio.serial.errors import SerialError
from kio.serial.readers import read_signed_varint, read_signed_varlong

from metactl.errors import (
    CorruptRecordError,
    InvalidRecordError,
    MessageTooLargeError,
    UnsupportedCompressionTypeError,
    UnsupportedForMessageFormatError,
)

HEADER: Final = struct.Struct(">qiibIhiqqqhii")
HEADER_BYTES: Final = HEADER.size  # 61
LOG_OVERHEAD: Final = 12  # baseOffset and batchLength: not counted in batchLength
CRC_START: Final = 21
MAGIC_V2: Final = 2
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1

COMPRESSION_MASK: Final = 0x07
TIMESTAMP_TYPE_MASK: Final = 0x08  # 1: LogAppendTime
TRANSACTIONAL_MASK: Final = 0x10
CONTROL_MASK: Final = 0x20


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """The whole batch's bytes, header included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def idempotent(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        """The sequence of the batch's last record (Kafka wraps at 2**31 - 1 to 0)."""
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (2**31)


def read_header(data: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader | None:
    """The header of the batch at `pos`, or None if fewer than 61 bytes remain there.

    Reads the fields only: whether they make sense is the validation's business."""
    if len(data) - pos < HEADER_BYTES:
        return None
    return BatchHeader(*HEADER.unpack_from(data, pos))


# --- validation of a Produce request's records -------------------------------------------

Buf = bytes | bytearray | memoryview

MAX_COMPRESSION: Final = 4  # 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd; 5-7 name no codec
ZSTD: Final = 4
_MIN_BATCH_LENGTH: Final = 14  # Kafka's LegacyRecord.RECORD_OVERHEAD_V0: smaller is corrupt
_PRODUCE_RECORDS: Final = "Produce records"  # the `path` of a CorruptLogError raised here
_OFFSET_AND_LENGTH: Final = struct.Struct(">qi")
_MAGIC_AT: Final = 16


def _corrupt(message: str) -> CorruptRecordError:
    return CorruptRecordError(message, path=_PRODUCE_RECORDS)


def validate_produce_records(
    data: Buf, *, max_batch_bytes: int, produce_version: int | None = None
) -> BatchHeader:
    """The header of the one batch a Produce request (v3+) carries for one partition, once
    the batch has passed Kafka's checks of a client's records; else the error Kafka
    answers for that partition.

    The checks, in Kafka's order: ProduceRequest.validateRecords and the batch iterator
    (ByteBufferLogInputStream), then UnifiedLog.analyzeAndValidateRecords, then
    LogValidator.validateBatch and the records of an uncompressed batch. A compressed
    batch is not decompressed: its header is checked, its records travel as they came
    (Kafka decompresses to validate each record; a malformed compressed payload is the
    consumer's to find). `produce_version`, when given, refuses zstd before v7 as Kafka.
    """
    size = len(data)
    # ByteBufferLogInputStream.nextBatchSize: a batchLength below the smallest legacy
    # record is CorruptRecordException; fewer bytes than a batch's first 17 (to the magic)
    # or than its batchLength make no batch, and ProduceRequest.validateRecords refuses a
    # partition without one (InvalidRecordException).
    if size < LOG_OVERHEAD:
        raise InvalidRecordError(f"no record batch: {size} bytes")
    base_offset, batch_length = _OFFSET_AND_LENGTH.unpack_from(data, 0)
    if batch_length < _MIN_BATCH_LENGTH:
        raise _corrupt(f"batchLength {batch_length} is below the minimum {_MIN_BATCH_LENGTH}")
    if size <= _MAGIC_AT:
        raise InvalidRecordError(f"no record batch: {size} bytes")
    magic = data[_MAGIC_AT]
    magic = magic - 256 if magic > 127 else magic
    if not 0 <= magic <= MAGIC_V2:
        raise _corrupt(f"invalid magic {magic}")  # nextBatchSize: CorruptRecordException
    if LOG_OVERHEAD + batch_length > size:
        raise InvalidRecordError(
            f"no complete record batch: batchLength {batch_length} needs "
            f"{LOG_OVERHEAD + batch_length} bytes, {size} given"
        )
    # ProduceRequest.validateRecords (v3+): magic 2 only, exactly one batch.
    if magic != MAGIC_V2:
        raise InvalidRecordError(f"magic {magic}: Produce v3+ takes magic 2 batches only")
    if LOG_OVERHEAD + batch_length < size:
        # A second batch, or trailing bytes that Kafka would trim off silently
        # (UnifiedLog.trimInvalidBytes): refused here rather than half-stored.
        raise InvalidRecordError(
            f"{size - LOG_OVERHEAD - batch_length} bytes after the record batch: "
            "exactly one batch per partition"
        )
    if size < HEADER_BYTES:
        # DefaultRecordBatch.isValid: shorter than a batch header is corrupt.
        raise _corrupt(f"batch of {size} bytes is shorter than its {HEADER_BYTES}-byte header")
    header = BatchHeader(*HEADER.unpack_from(data, 0))
    if produce_version is not None and produce_version < 7 and header.compression == ZSTD:
        raise UnsupportedCompressionTypeError(
            f"Produce v{produce_version} may not use zstd compression (v7+)"
        )
    # UnifiedLog.analyzeAndValidateRecords: a client's v2 batch starts at offset 0, fits
    # max.message.bytes (RecordTooLargeException), and its CRC holds.
    if base_offset != 0:
        raise InvalidRecordError(f"baseOffset of a client's batch is {base_offset}, not 0")
    if size > max_batch_bytes:
        raise MessageTooLargeError(
            f"record batch of {size} bytes exceeds the maximum of {max_batch_bytes}"
        )
    crc = crc32c(memoryview(data)[CRC_START:])
    if crc != header.crc:
        raise _corrupt(f"batch CRC-32C is {crc:#010x}, the header says {header.crc:#010x}")
    # Kafka's CompressionType.forId throws IllegalArgumentException on 5-7, which the
    # broker answers UNKNOWN_SERVER_ERROR; we name the client's fault instead.
    if header.compression > MAX_COMPRESSION:
        raise UnsupportedCompressionTypeError(f"compression type {header.compression} is unknown")
    # LogValidator.validateBatch (origin CLIENT).
    if header.last_offset_delta < 0:
        raise InvalidRecordError(
            f"invalid offset range: lastOffsetDelta {header.last_offset_delta}"
        )
    if header.records_count <= 0:
        raise InvalidRecordError(f"invalid reported count for record batch: {header.records_count}")
    if header.last_offset_delta + 1 != header.records_count:
        raise InvalidRecordError(
            f"inconsistent batch offset range (lastOffsetDelta {header.last_offset_delta}) "
            f"and count of records {header.records_count}"
        )
    if header.control:
        raise InvalidRecordError("clients are not allowed to write control records")
    if header.idempotent and header.base_sequence < 0:
        raise InvalidRecordError(
            f"invalid sequence number {header.base_sequence} in a batch of producer "
            f"{header.producer_id}"
        )
    if header.transactional:
        # No transactions here. Kafka refuses a transactional batch the log's format
        # cannot hold with UnsupportedForMessageFormatException (validateBatch, magic < 2):
        # the same "this log cannot store it", non-retriable in every client, and unlike
        # INVALID_RECORD it does not say the client built a bad batch.
        # (TRANSACTIONAL_ID_AUTHORIZATION_FAILED would blame ACLs; UNSUPPORTED_VERSION the
        # request's version, which is fine.)
        raise UnsupportedForMessageFormatError(
            "transactional batches are not supported (metactl has no transactions)"
        )
    if header.compression == 0:
        _check_records(data, HEADER_BYTES, size, header.records_count)
    return header


def _check_records(data: Buf, pos: int, end: int, count: int) -> None:
    """Kafka's checks of the records of an uncompressed batch in data[..end], its
    records starting at `pos`: exactly `count` well-formed records ending at `end`, as
    `_records` reads them (the same checks, in the same order, with the same errors), and
    record i's offset delta is i (LogValidator's compressed path: "inner records offset
    should always be continuous"; here for uncompressed batches too, whose offsets we
    never rewrite).

    `_records` inlined, without a tuple per record: this loop runs once per record of
    every uncompressed Produce, and is most of the leader's work on a batch."""
    buf = data if type(data) is bytes and len(data) == end else bytes(data[:end])
    varint, varlong = read_signed_varint, read_signed_varlong
    i = 0
    try:
        for i in range(count):
            b = buf[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif (c := buf[pos + 1]) < 0x80:
                b = (b & 0x7F) | c << 7
                length, pos = (b >> 1) ^ -(b & 1), pos + 2
            else:
                length, n = varint(buf, pos)
                pos += n
            rec_end = pos + length
            if length < 0 or rec_end > end:
                raise InvalidRecordError(f"record {i}: invalid record size {length}")
            if buf[pos + 1] < 0x80:  # the timestamp delta (after the attributes, unused)
                pos += 2
            elif buf[pos + 2] < 0x80:
                pos += 3
            else:
                pos += 1 + varlong(buf, pos + 1)[1]
            b = buf[pos]
            if b < 0x80:
                delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif (c := buf[pos + 1]) < 0x80:
                b = (b & 0x7F) | c << 7
                delta, pos = (b >> 1) ^ -(b & 1), pos + 2
            else:
                delta, n = varint(buf, pos)
                pos += n
            b = buf[pos]  # the key: a negative length is null, as Kafka
            if b < 0x80:
                pos += 1 if b & 1 else 1 + (b >> 1)
            else:
                field_len, n = varint(buf, pos)
                pos += n + field_len if field_len > 0 else n
            b = buf[pos]  # the value
            if b < 0x80:
                pos += 1 if b & 1 else 1 + (b >> 1)
            elif (c := buf[pos + 1]) < 0x80:
                b = (b & 0x7F) | c << 7
                pos += 2 if b & 1 else 2 + (b >> 1)
            else:
                field_len, n = varint(buf, pos)
                pos += n + field_len if field_len > 0 else n
            if pos > rec_end:
                raise InvalidRecordError(f"record {i}: its fields overrun its size {length}")
            b = buf[pos]
            if b == 0:  # no headers: most records
                pos += 1
            else:
                pos = _skip_headers(buf, pos, rec_end, i, length)
            if pos != rec_end:
                raise InvalidRecordError(
                    f"record {i}: size {length} but its fields take {length + pos - rec_end}"
                )
            if delta != i:
                raise InvalidRecordError(f"record {i} has offset delta {delta}")
    except (SerialError, ValueError, IndexError) as exc:  # past the end, or too long
        raise InvalidRecordError(f"record {i}: malformed ({exc})") from exc
    if pos != end:
        raise InvalidRecordError(f"{end - pos} bytes after the batch's {count} records")


def _skip_headers(buf: bytes, pos: int, rec_end: int, i: int, length: int) -> int:
    """Where the headers of record `i` (of size `length`, ending at `rec_end`) starting
    with their count at `pos` end; InvalidRecordError as `_records`."""
    headers, n = read_signed_varint(buf, pos)
    pos += n
    if headers < 0:
        raise InvalidRecordError(f"record {i}: invalid number of headers {headers}")
    for _ in range(headers):
        hkey_len, n = read_signed_varint(buf, pos)
        if hkey_len < 0:
            raise InvalidRecordError(f"record {i}: negative header key size")
        pos += n + hkey_len
        hvalue_len, n = read_signed_varint(buf, pos)
        pos += n + max(hvalue_len, 0)
        if pos > rec_end:
            raise InvalidRecordError(f"record {i}: its headers overrun its size {length}")
    return pos


def _records(data: Buf, pos: int, end: int, header: BatchHeader) -> Iterator[tuple[int, int]]:
    """(offsetDelta, timestampDelta) of each record of the uncompressed batch in
    data[..end], its records starting at `pos`: exactly `records_count` records ending at
    `end` (Kafka's DefaultRecord.readFrom and the batch iterator's "records still
    remaining" check), each of the length it declares; else InvalidRecordError.

    Varints are kio's (`read_signed_varint`), with the one-byte case inline: it is most
    of them, and this loop runs once per record of every uncompressed Produce."""
    buf = bytes(data[:end])
    varint, varlong = read_signed_varint, read_signed_varlong
    i = 0
    try:
        for i in range(header.records_count):
            b = buf[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                length, n = varint(buf, pos)
                pos += n
            rec_end = pos + length
            if length < 0 or rec_end > end:
                raise InvalidRecordError(f"record {i}: invalid record size {length}")
            b = buf[pos + 1]  # after the attributes, unused
            if b < 0x80:
                ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 2
            else:
                ts_delta, n = varlong(buf, pos + 1)
                pos += 1 + n
            b = buf[pos]
            if b < 0x80:
                offset_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                offset_delta, n = varint(buf, pos)
                pos += n
            for _ in (0, 1):  # the key, the value: a negative length is null, as Kafka
                b = buf[pos]
                if b < 0x80:
                    pos += 1 + (0 if b & 1 else b >> 1)
                else:
                    field_len, n = varint(buf, pos)
                    pos += n + max(field_len, 0)
            if pos > rec_end:
                raise InvalidRecordError(f"record {i}: its fields overrun its size {length}")
            pos = _skip_headers(buf, pos, rec_end, i, length)
            if pos != rec_end:
                raise InvalidRecordError(
                    f"record {i}: size {length} but its fields take {length + pos - rec_end}"
                )
            yield offset_delta, ts_delta
    except (SerialError, ValueError, IndexError) as exc:  # past the end, or too long
        raise InvalidRecordError(f"record {i}: malformed ({exc})") from exc
    if pos != end:
        raise InvalidRecordError(
            f"{end - pos} bytes after the batch's {header.records_count} records"
        )


# --- the leader's side: stamping, null batches, timestamps --------------------------------

_STAMP_OFFSET: Final = struct.Struct(">q")
_STAMP_EPOCH: Final = struct.Struct(">i")
_EPOCH_AT: Final = 12


def stamp(data: Buf, base_offset: int, leader_epoch: int) -> bytes:
    """The batch with its baseOffset and partitionLeaderEpoch set, as the leader does on
    append: both lie outside the CRC, which stays valid."""
    if len(data) < HEADER_BYTES:
        raise ValueError(f"not a record batch: {len(data)} bytes")
    view = memoryview(data)
    return b"".join(  # one copy of the batch (a client's is up to message.max.bytes)
        (
            _STAMP_OFFSET.pack(base_offset),
            view[LOG_OVERHEAD - 4 : _EPOCH_AT],  # batchLength
            _STAMP_EPOCH.pack(leader_epoch),
            view[_EPOCH_AT + 4 :],
        )
    )


# The records of a null batch do not depend on its offset, epoch or time (every delta is
# relative): the records section of `count` null records is a prefix of that of any more.
# One blob serves them all; `_null_cache[1][i]` is where record i ends.
_NULL_CACHE_MAX: Final = 1 << 17  # records (~1 MiB of blob); longer batches build uncached
_null_cache: list[tuple[bytes, tuple[int, ...]]] = [(b"", (0,))]  # one slot, replaced whole


def _varint(n: int) -> bytes:
    """Kafka's zigzag varint of an int32 >= 0 (zigzag of n >= 0 is 2n)."""
    z = n << 1
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _null_record(delta: int) -> bytes:
    # attributes 0, timestampDelta 0, offsetDelta, key -1 (null), value -1, 0 headers
    body = b"\x00\x00" + _varint(delta) + b"\x01\x01\x00"
    return _varint(len(body)) + body


def _null_records(count: int) -> bytes | memoryview:
    blob, ends = _null_cache[0]
    if count >= len(ends):
        if count > _NULL_CACHE_MAX:
            return b"".join(_null_record(i) for i in range(count))
        grow = max(count, 2 * (len(ends) - 1), 64)
        grow = min(grow, _NULL_CACHE_MAX)
        parts = [blob]
        new_ends = list(ends)
        pos = len(blob)
        for i in range(len(ends) - 1, grow):
            rec = _null_record(i)
            parts.append(rec)
            pos += len(rec)
            new_ends.append(pos)
        blob, ends = b"".join(parts), tuple(new_ends)
        _null_cache[0] = (blob, ends)  # one assignment: a reader sees the old or the new
    return memoryview(blob)[: ends[count]]


_NULL_BEFORE_CRC: Final = struct.Struct(">qiibI")
_NULL_AFTER_CRC: Final = struct.Struct(">hiqqqhii")


def null_records_batch(base_offset: int, count: int, leader_epoch: int, timestamp_ms: int) -> bytes:
    """A valid uncompressed v2 batch of `count` records with null key and value and no
    headers, CreateTime `timestamp_ms`, no producer id: what a Kafka consumer reads at
    offsets written by metactl's native producer, which stores no bytes."""
    if count < 1:
        raise ValueError(f"a record batch holds at least one record, not {count}")
    records = _null_records(count)
    after_crc = _NULL_AFTER_CRC.pack(
        0, count - 1, timestamp_ms, timestamp_ms, NO_PRODUCER_ID, NO_PRODUCER_EPOCH,
        NO_SEQUENCE, count,
    )  # fmt: skip
    crc = crc32c(records, crc32c(after_crc))
    batch_length = HEADER_BYTES - LOG_OVERHEAD + len(records)
    head = _NULL_BEFORE_CRC.pack(base_offset, batch_length, leader_epoch, MAGIC_V2, crc)
    return b"".join((head, after_crc, records))


def offset_for_timestamp(data: Buf, target_ms: int) -> int | None:
    """The offset of the first record of this stored (stamped) batch whose timestamp is
    `target_ms` or later (ListOffsets by timestamp), or None if it has none
    (`record_at_timestamp`)."""
    found = record_at_timestamp(data, target_ms)
    return None if found is None else found[1]


def record_at_timestamp(data: Buf, target_ms: int) -> tuple[int, int] | None:
    """(timestamp, offset) of the first record of this stored (stamped) batch whose
    timestamp is `target_ms` or later, or None if it has none.

    Uncompressed: per record, as Kafka. Compressed: the batch's maxTimestamp and base
    offset if the maxTimestamp reaches the target, else None. An approximation: Kafka
    decompresses and finds the record; a consumer starting at the base offset reads the
    batch's earlier records too. LogAppendTime: every record has the batch's
    maxTimestamp, as in Kafka.
    """
    header = read_header(data)
    if header is None:
        raise ValueError(f"not a record batch: {len(data)} bytes")
    end = min(len(data), header.size)
    if header.compression != 0 or header.attributes & TIMESTAMP_TYPE_MASK:
        if header.max_timestamp >= target_ms:
            return header.max_timestamp, header.base_offset
        return None
    for delta, ts_delta in _records(data, HEADER_BYTES, end, header):
        if header.base_timestamp + ts_delta >= target_ms:
            return header.base_timestamp + ts_delta, header.base_offset + delta
    return None


def iter_batches(data: Buf) -> Iterator[BatchHeader]:
    """The header of each whole batch of a concatenation of stored batches (a segment, a
    Fetch answer), in order; the batch at a header starts where the previous one ended
    (the first at 0; `header.size` bytes each). A partial batch at the end is not
    yielded, as Kafka's batch iterator skips it. A batchLength too small to hold a header
    is CORRUPT_MESSAGE."""
    pos = 0
    while (header := read_header(data, pos)) is not None and pos + header.size <= len(data):
        if header.batch_length < HEADER_BYTES - LOG_OVERHEAD:
            raise CorruptRecordError(
                f"batchLength {header.batch_length} at byte {pos}", path="record batches"
            )
        yield header
        pos += header.size
