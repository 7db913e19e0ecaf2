"""Kafka record batches (protocol/kafka/records.py): a Produce partition's records are
accepted or refused with Kafka's code, the leader's stamp keeps the CRC, the null batches
parse, ListOffsets by timestamp, and a fuzz test of the validation.

Valid batches come from kio's writer; kio's reader is the oracle of what parses."""

from __future__ import annotations

import datetime
import gzip
import io
import os
import struct
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch
from kio.records.schema import NewRecordBatch, Record, RecordHeader
from kio.records.writers import write_batch, write_record
from kio.schema.errors import ErrorCode
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from metactl.errors import InvalidRecordError, MetactlError
from protocol.kafka import records as R
from protocol.kafka.records import (
    CONTROL_MASK,
    CRC_START,
    HEADER,
    HEADER_BYTES,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    iter_batches,
    null_records_batch,
    offset_for_timestamp,
    read_header,
    stamp,
    validate_produce_records,
)

MAX = 1 << 20
T0 = 1_700_000_000  # seconds: kio's writer goes through float seconds, whole ones are exact


def _ts(seconds: int) -> TZAwareMicros:
    return TZAwareMicros.parse(datetime.datetime.fromtimestamp(seconds, datetime.UTC))


def record(
    offset: int,
    *,
    key: bytes | None = b"k",
    value: bytes | None = b"value",
    headers: tuple[tuple[bytes, bytes | None], ...] = (),
    seconds: int = T0,
) -> Record:
    return Record(
        attributes=i8(0),
        timestamp=_ts(seconds),
        offset=i64(offset),
        key=key,
        value=value,
        headers=tuple(RecordHeader(key=k, value=v) for k, v in headers),
    )


def batch(
    n: int = 3,
    *,
    producer_id: int = -1,
    epoch: int = -1,
    seq: int = -1,
    attributes: int = 0,
    records: tuple[Record, ...] | None = None,
) -> bytes:
    """A client's batch, written by kio."""
    buf = io.BytesIO()
    write_batch(
        buf,
        NewRecordBatch(
            producer_id=i64(producer_id),
            producer_epoch=i16(epoch),
            base_sequence=i32(seq),
            records=records if records is not None else tuple(record(i) for i in range(n)),
            attributes=i16(attributes),
        ),
    )
    return buf.getvalue()


def resign(data: bytes | bytearray) -> bytes:
    """`data` with its CRC recomputed (so that a test reaches the checks after it)."""
    data = bytes(data)
    return data[:17] + struct.pack(">I", crc32c(data[CRC_START:])) + data[CRC_START:]


def with_fields(data: bytes, **fields: int) -> bytes:
    """`data` with header fields replaced, CRC recomputed."""
    header = read_header(data)
    assert header is not None
    values = {name: getattr(header, name) for name in BatchHeader.__slots__}
    values.update(fields)
    head = HEADER.pack(*(values[name] for name in BatchHeader.__slots__))
    return resign(head + data[HEADER_BYTES:])


def raw_records(n: int) -> bytes:
    buf = io.BytesIO()
    for i in range(n):
        write_record(buf, record(i), i64(T0 * 1000), i64(0))
    return buf.getvalue()


def compressed(codec: int, payload: bytes, n: int = 3) -> bytes:
    """A batch whose records section is `payload` as is (as if compressed by `codec`)."""
    plain = batch(n)
    return with_fields(
        plain[:HEADER_BYTES] + payload,
        attributes=codec,
        batch_length=HEADER_BYTES - LOG_OVERHEAD + len(payload),
    )


def refused(data: bytes, code: str, **kwargs: int) -> MetactlError:
    kwargs.setdefault("max_batch_bytes", MAX)
    with pytest.raises(MetactlError) as e:
        validate_produce_records(data, **kwargs)
    assert e.value.code == code, e.value
    assert ErrorCode[code.lower()] is not None  # a code Kafka clients know
    return e.value


# --- valid batches --------------------------------------------------------------------


def test_a_valid_batch_gives_its_header() -> None:
    data = batch(3)
    header = validate_produce_records(data, max_batch_bytes=MAX)
    assert (header.base_offset, header.records_count, header.last_offset_delta) == (0, 3, 2)
    assert header.size == len(data) == LOG_OVERHEAD + header.batch_length
    assert (header.magic, header.compression, header.producer_id) == (2, 0, -1)
    assert header.base_timestamp == header.max_timestamp == T0 * 1000


def test_keys_values_and_headers_of_every_shape_pass() -> None:
    recs = (
        record(0, key=None, value=None),
        record(1, key=b"", value=b"", headers=((b"h", None), (b"", b"v"))),
        record(2, key=b"k" * 300, value=b"v" * 70_000, headers=((b"x" * 200, b"y" * 200),)),
    )
    data = batch(records=recs)
    assert validate_produce_records(data, max_batch_bytes=MAX).records_count == 3
    parsed, _ = read_batch(data, 0)
    assert [r.value for r in parsed.records] == [None, b"", b"v" * 70_000]


def test_an_idempotent_batch_passes() -> None:
    header = validate_produce_records(batch(4, producer_id=7, epoch=2, seq=10), max_batch_bytes=MAX)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 10)
    assert header.last_sequence == 13


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_compressed_batch_passes_on_its_header_alone(codec: int) -> None:
    data = compressed(codec, gzip.compress(raw_records(3)))
    assert validate_produce_records(data, max_batch_bytes=MAX).compression == codec
    # Not decompressed: a payload that is no codec's still passes (the consumer's to find).
    assert validate_produce_records(compressed(codec, b"not compressed"), max_batch_bytes=MAX)


def test_zstd_needs_produce_v7() -> None:
    data = compressed(4, b"zstd frame")
    refused(data, "UNSUPPORTED_COMPRESSION_TYPE", produce_version=6)
    assert validate_produce_records(data, max_batch_bytes=MAX, produce_version=7)


def test_a_bytearray_or_memoryview_passes_too() -> None:
    data = batch(2)
    assert validate_produce_records(bytearray(data), max_batch_bytes=MAX)
    assert validate_produce_records(memoryview(data), max_batch_bytes=MAX)


# --- each rule, refused with Kafka's code -----------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 11])
def test_no_batch_at_all_is_invalid_record(size: int) -> None:
    refused(batch(1)[:size], "INVALID_RECORD")


def test_a_batch_length_below_the_legacy_minimum_is_corrupt() -> None:
    data = batch(1)
    refused(data[:8] + struct.pack(">i", 13) + data[12:], "CORRUPT_MESSAGE")
    refused(data[:8] + struct.pack(">i", -1) + data[12:], "CORRUPT_MESSAGE")


@pytest.mark.parametrize("magic", [0, 1])
def test_an_old_magic_is_invalid_record(magic: int) -> None:
    data = batch(1)
    refused(data[:16] + bytes([magic]) + data[17:], "INVALID_RECORD")


@pytest.mark.parametrize("magic", [3, 0x7F, 0xFF])
def test_an_unknown_magic_is_corrupt(magic: int) -> None:
    data = batch(1)
    refused(data[:16] + bytes([magic]) + data[17:], "CORRUPT_MESSAGE")


def test_a_truncated_batch_is_no_batch() -> None:
    data = batch(3)
    for size in (16, 17, HEADER_BYTES, len(data) - 1):
        refused(data[:size], "INVALID_RECORD")


def test_exactly_one_batch_and_no_trailing_bytes() -> None:
    data = batch(2)
    refused(data + data, "INVALID_RECORD")
    refused(data + b"\x00", "INVALID_RECORD")


def test_a_batch_shorter_than_its_header_is_corrupt() -> None:
    data = batch(1)[:40]
    refused(data[:8] + struct.pack(">i", 40 - LOG_OVERHEAD) + data[12:], "CORRUPT_MESSAGE")


def test_a_clients_batch_starts_at_offset_0() -> None:
    refused(with_fields(batch(2), base_offset=5), "INVALID_RECORD")


def test_the_size_limit_is_message_too_large() -> None:
    data = batch(3)
    assert validate_produce_records(data, max_batch_bytes=len(data))
    refused(data, "MESSAGE_TOO_LARGE", max_batch_bytes=len(data) - 1)


def test_a_bad_crc_is_corrupt_message() -> None:
    data = bytearray(batch(3))
    data[-1] ^= 0x01  # in the last record's value
    err = refused(bytes(data), "CORRUPT_MESSAGE")
    assert "CRC" in str(err)
    data = bytearray(batch(3))
    data[CRC_START] ^= 0x01  # the attributes are covered too
    refused(bytes(data), "CORRUPT_MESSAGE")


def test_the_base_offset_and_leader_epoch_are_outside_the_crc() -> None:
    data = batch(2)
    moved = data[:12] + struct.pack(">i", 99) + data[16:]  # leader epoch: no re-sign
    assert validate_produce_records(moved, max_batch_bytes=MAX).partition_leader_epoch == 99


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_compression_types_5_to_7_are_unsupported(codec: int) -> None:
    refused(with_fields(batch(2), attributes=codec), "UNSUPPORTED_COMPRESSION_TYPE")


def test_the_count_and_the_offset_range_must_agree() -> None:
    data = batch(3)
    refused(with_fields(data, last_offset_delta=-1), "INVALID_RECORD")
    refused(with_fields(data, records_count=0, last_offset_delta=-1), "INVALID_RECORD")
    refused(with_fields(data, records_count=0), "INVALID_RECORD")
    refused(with_fields(data, records_count=-3), "INVALID_RECORD")
    refused(with_fields(data, last_offset_delta=3), "INVALID_RECORD")
    refused(with_fields(data, records_count=4), "INVALID_RECORD")


def test_control_batches_from_a_client_are_invalid_record() -> None:
    refused(with_fields(batch(1), attributes=CONTROL_MASK), "INVALID_RECORD")


def test_transactional_batches_are_unsupported_for_the_message_format() -> None:
    data = batch(2, producer_id=1, epoch=0, seq=0, attributes=TRANSACTIONAL_MASK)
    refused(data, "UNSUPPORTED_FOR_MESSAGE_FORMAT")
    refused(with_fields(data, attributes=TRANSACTIONAL_MASK | 1), "UNSUPPORTED_FOR_MESSAGE_FORMAT")


def test_an_idempotent_batch_needs_a_sequence() -> None:
    refused(batch(2, producer_id=3, epoch=0, seq=-1), "INVALID_RECORD")


def test_more_or_fewer_records_than_the_header_counts() -> None:
    data = batch(3)
    refused(with_fields(data, records_count=4, last_offset_delta=3), "INVALID_RECORD")
    two = with_fields(data, records_count=2, last_offset_delta=1)
    refused(two, "INVALID_RECORD")  # a third record's bytes follow the two counted


def test_offset_deltas_run_0_to_n_minus_1() -> None:
    recs = (record(0), record(2), record(2))  # lastOffsetDelta 2, count 3: header fine
    err = refused(batch(records=recs), "INVALID_RECORD")
    assert "record 1" in str(err)


def test_a_records_length_must_match_its_fields() -> None:
    data = bytearray(batch(1))
    # The first record's length varint (one byte, zigzag): one more, then one less.
    length = data[HEADER_BYTES] >> 1
    for wrong in (length + 1, length - 1):
        data[HEADER_BYTES] = wrong << 1
        refused(resign(data), "INVALID_RECORD")


def test_bytes_after_the_records_inside_the_batch_are_invalid() -> None:
    data = batch(2) + b"\x00\x00"
    data = data[:8] + struct.pack(">i", len(data) - LOG_OVERHEAD) + data[12:]
    err = refused(resign(data), "INVALID_RECORD")
    assert "2 bytes after" in str(err)


def test_a_negative_header_count_or_key_size_is_invalid() -> None:
    one = batch(records=(record(0, headers=((b"h", b"v"),)),))
    body = bytearray(one[HEADER_BYTES:])
    # length, attributes 0, ts 0, offset 0, key len 1 'k', value len 5 'value', 1 header
    at = body.index(b"value") + 5
    assert body[at] == 2  # one header (zigzag)
    body[at] = 1  # -1 headers
    refused(resign(one[:HEADER_BYTES] + body), "INVALID_RECORD")
    body[at] = 2
    body[at + 1] = 1  # header key size -1
    refused(resign(one[:HEADER_BYTES] + body), "INVALID_RECORD")


def test_a_varint_running_past_the_batch_is_invalid() -> None:
    data = bytearray(batch(1))
    data[-1] = 0x80  # the record's last varint now continues past the end
    refused(resign(data), "INVALID_RECORD")


# --- stamp --------------------------------------------------------------------------------


def test_stamp_sets_the_offset_and_epoch_and_keeps_the_crc() -> None:
    data = batch(3, producer_id=4, epoch=1, seq=0)
    stored = stamp(data, 1_000, 7)
    header = read_header(stored)
    assert header is not None
    assert (header.base_offset, header.partition_leader_epoch, header.last_offset) == (
        1_000,
        7,
        1_002,
    )
    assert stored[LOG_OVERHEAD:] != data[LOG_OVERHEAD:]  # the epoch changed...
    assert stored[16:] == data[16:]  # ...and nothing under the CRC
    parsed, _ = read_batch(stored, 0)  # kio checks the CRC
    assert [r.offset for r in parsed.records] == [1_000, 1_001, 1_002]


def test_stamp_refuses_what_is_not_a_batch() -> None:
    with pytest.raises(ValueError):
        stamp(b"\x00" * 60, 0, 0)


# --- null batches -------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 63, 64, 65, 1_000, 10_000])
def test_a_null_batch_parses_with_kio_and_has_the_offsets(count: int) -> None:
    data = null_records_batch(500, count, 3, T0 * 1000)
    parsed, size = read_batch(data, 0)
    assert size == len(data)
    assert [r.offset for r in parsed.records] == list(range(500, 500 + count))
    assert all(r.key is None and r.value is None and r.headers == () for r in parsed.records)
    assert parsed.records[-1].timestamp == _ts(T0)
    header = read_header(data)
    assert header is not None
    assert (header.partition_leader_epoch, header.records_count, header.last_offset) == (
        3,
        count,
        500 + count - 1,
    )
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert header.attributes == 0  # uncompressed, CreateTime
    assert header.base_timestamp == header.max_timestamp == T0 * 1000
    # As a client would send it, it passes our own validation.
    sent = stamp(data, 0, 0)
    assert validate_produce_records(sent, max_batch_bytes=MAX) == read_header(sent)


def test_null_batches_of_any_size_in_any_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R, "_null_cache", [(b"", (0,))])
    monkeypatch.setattr(R, "_NULL_CACHE_MAX", 100)
    for count in (70, 3, 100, 101, 250, 1, 99):  # grows the cache, then beyond it
        data = null_records_batch(0, count, 0, 5)
        parsed, _ = read_batch(data, 0)
        assert len(parsed.records) == count
        assert validate_produce_records(data, max_batch_bytes=MAX).records_count == count
    assert len(R._null_cache[0][1]) == 101  # capped


def test_a_null_batch_holds_at_least_one_record() -> None:
    with pytest.raises(ValueError):
        null_records_batch(0, 0, 0, 0)


# --- offset_for_timestamp --------------------------------------------------------------------


def _timed(*seconds: int, attributes: int = 0) -> bytes:
    recs = tuple(record(i, seconds=s) for i, s in enumerate(seconds))
    return stamp(batch(records=recs, attributes=attributes), 100, 0)


def test_offset_for_timestamp_per_record() -> None:
    stored = _timed(T0 + 10, T0 + 20, T0 + 20, T0 + 5, T0 + 30)
    ms = 1000
    assert offset_for_timestamp(stored, 0) == 100
    assert offset_for_timestamp(stored, (T0 + 10) * ms) == 100
    assert offset_for_timestamp(stored, (T0 + 10) * ms + 1) == 101
    assert offset_for_timestamp(stored, (T0 + 20) * ms) == 101
    assert offset_for_timestamp(stored, (T0 + 21) * ms) == 104  # not 103: its time is older
    assert offset_for_timestamp(stored, (T0 + 30) * ms) == 104
    assert offset_for_timestamp(stored, (T0 + 30) * ms + 1) is None


def test_offset_for_timestamp_of_a_null_batch() -> None:
    stored = null_records_batch(40, 5, 0, 777)
    assert offset_for_timestamp(stored, 777) == 40
    assert offset_for_timestamp(stored, 778) is None


def test_offset_for_timestamp_of_a_compressed_batch_is_its_base_offset() -> None:
    stored = stamp(compressed(1, gzip.compress(raw_records(3))), 60, 0)
    header = read_header(stored)
    assert header is not None
    assert offset_for_timestamp(stored, header.max_timestamp) == 60
    assert offset_for_timestamp(stored, header.max_timestamp + 1) is None


def test_offset_for_timestamp_under_log_append_time_is_the_batchs() -> None:
    stored = _timed(T0 + 10, T0 + 20, attributes=TIMESTAMP_TYPE_MASK)
    stored = with_fields(stored, max_timestamp=(T0 + 50) * 1000)
    assert offset_for_timestamp(stored, (T0 + 50) * 1000) == 100
    assert offset_for_timestamp(stored, (T0 + 50) * 1000 + 1) is None


def test_offset_for_timestamp_reads_one_batch_of_a_concatenation() -> None:
    first, second = _timed(T0), stamp(batch(1), 103, 0)
    assert offset_for_timestamp(first + second, T0 * 1000) == 100


# --- iter_batches -------------------------------------------------------------------------


def test_iter_batches_yields_whole_batches_only() -> None:
    one, two, three = stamp(batch(1), 0, 0), null_records_batch(1, 4, 0, 0), stamp(batch(2), 5, 1)
    data = one + two + three
    assert [h.base_offset for h in iter_batches(data)] == [0, 1, 5]
    assert [h.base_offset for h in iter_batches(data + three[:70])] == [0, 1, 5]
    assert list(iter_batches(b"")) == []
    bad = one[:8] + struct.pack(">i", 10) + one[12:]
    with pytest.raises(MetactlError) as e:
        list(iter_batches(bad))
    assert e.value.code == "CORRUPT_MESSAGE"


# --- fuzz -------------------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("METACTL_HYPOTHESIS_EXAMPLES", "300"))
KAFKA_CODES = {e.name.upper() for e in ErrorCode}

_records_st = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=40),
        st.lists(st.tuples(st.binary(max_size=5), st.none() | st.binary(max_size=5)), max_size=2),
        st.integers(0, 100),
    ),
    min_size=1,
    max_size=6,
)


@st.composite
def valid_batches(draw: st.DrawFn) -> bytes:
    recs = tuple(
        record(i, key=k, value=v, headers=tuple(h), seconds=T0 + s)
        for i, (k, v, h, s) in enumerate(draw(_records_st))
    )
    idempotent = draw(st.booleans())
    data = batch(
        records=recs,
        producer_id=draw(st.integers(0, 2**40)) if idempotent else -1,
        epoch=draw(st.integers(0, 2**15 - 1)) if idempotent else -1,
        seq=draw(st.integers(0, 2**31 - 1)) if idempotent else -1,
    )
    codec = draw(st.sampled_from([0, 0, 0, 1, 4]))
    if codec:
        data = compressed(codec, gzip.compress(data[HEADER_BYTES:]), len(recs))
    return data


_INT32_FIELDS = [8, 23, 57]  # batchLength, lastOffsetDelta, recordsCount


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(valid_batches()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(
            st.sampled_from(["flip", "truncate", "extend", "int32", "byte", "varint", "reclen"])
        )
        if kind == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=20))
        elif kind == "int32" and len(data) >= HEADER_BYTES:
            value = draw(st.integers(-(2**31), 2**31 - 1) | st.integers(-2, 200))
            struct.pack_into(">i", data, draw(st.sampled_from(_INT32_FIELDS)), value)
        elif kind == "byte" and len(data) > HEADER_BYTES:  # a record's bytes: lengths, varints
            at = draw(st.integers(HEADER_BYTES, len(data) - 1))
            data[at] = draw(st.integers(0, 255))
        elif kind == "reclen" and len(data) > HEADER_BYTES and 4 <= data[HEADER_BYTES] < 0x7C:
            data[HEADER_BYTES] += draw(st.sampled_from([-4, -2, 2, 4]))  # first record's length
        elif kind == "varint" and len(data) > HEADER_BYTES:
            at = draw(st.integers(HEADER_BYTES, len(data)))
            data[at:at] = draw(st.sampled_from([b"\x80", b"\xff" * 5, b"\x01", b"\x7f"]))
    repair = draw(st.sampled_from(["none", "crc", "all", "all"]))
    if repair == "all" and len(data) >= HEADER_BYTES:
        # The base offset and batchLength made right again: the mutation reaches the
        # records (and the count checks) rather than the first refusal of the framing.
        struct.pack_into(">qi", data, 0, 0, len(data) - LOG_OVERHEAD)
    if repair != "none" and len(data) >= HEADER_BYTES:
        data = bytearray(resign(data))  # then past the CRC check too
    return bytes(data)


def _check(data: bytes) -> None:
    try:
        header = validate_produce_records(data, max_batch_bytes=MAX)
    except MetactlError as exc:
        assert exc.code in KAFKA_CODES, exc
        return
    # Accepted: every header rule holds...
    assert header == read_header(data)
    assert header.size == len(data) and header.magic == 2 and header.base_offset == 0
    assert crc32c(data[CRC_START:]) == header.crc
    assert header.records_count == header.last_offset_delta + 1 >= 1
    assert not header.control and not header.transactional and header.compression <= 4
    # ...and an uncompressed batch's records parse with kio to as many records, unless
    # only kio refuses them: a key or value length below -1 (null to Kafka and to us), a
    # timestamp out of datetime's range (Kafka takes any int64).
    if header.compression == 0:
        try:
            parsed, size = read_batch(data, 0)
        except (ValueError, OverflowError, OSError) as exc:
            # kio makes each record's time a datetime: years past 9999 fail there only.
            assert "Invalid length" in str(exc) or "year" in str(exc) or "range" in str(exc), exc
        else:
            assert size == len(data) and len(parsed.records) == header.records_count


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_batches())
def test_fuzz_valid_batches_pass(data: bytes) -> None:
    assert validate_produce_records(data, max_batch_bytes=MAX).size == len(data)


@settings(max_examples=EXAMPLES * 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_mutated_batches_give_a_header_or_a_coded_error(data: bytes) -> None:
    _check(data)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_arbitrary_bytes_give_a_header_or_a_coded_error(data: bytes) -> None:
    _check(data)


def _reference_check(data: bytes, count: int) -> None:
    """The records check as `_records` reads them, with the offset-delta check: what the
    inlined `_check_records` must do."""
    for expected, (delta, _ts) in enumerate(
        R._records(data, HEADER_BYTES, len(data), R.BatchHeader(*R.HEADER.unpack_from(data)))
    ):
        if delta != expected:
            raise InvalidRecordError(f"record {expected} has offset delta {delta}")


def _outcome(check: Any, data: bytes, count: int) -> tuple[str, str]:
    try:
        check(data, count)
    except MetactlError as exc:
        # The detail of an out-of-range read ("Buffer is exhausted" from kio's reader,
        # "index out of range" inline) may differ; the error and its record may not.
        return exc.code, exc.message.split(" (")[0]
    return "ok", ""


@settings(max_examples=EXAMPLES * 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_the_inlined_records_check_agrees_with_the_records_reader(data: bytes) -> None:
    if len(data) < HEADER_BYTES:
        return
    count = R.HEADER.unpack_from(data)[-1]
    if not 0 < count <= 10_000:
        return
    inline = _outcome(lambda d, n: R._check_records(d, HEADER_BYTES, len(d), n), data, count)
    assert inline == _outcome(_reference_check, data, count)
