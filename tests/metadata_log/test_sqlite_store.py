"""What only the SQLite backend does: its file, damage detection, disk full, followers."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import msgspec
import pytest

from metactl.errors import (
    CorruptLogError,
    FatalStorageError,
    InvalidRequestError,
    LogError,
    LogSchemaError,
    StorageError,
)
from metadata_log.batch_format import batch_crc
from metadata_log.records import MetadataRecord, NoOpRecord, TopicRecord, encode_batch
from metadata_log.sqlite_format import LOG_FILE_NAME, resolve_log_path
from metadata_log.sqlite_store import SqliteLogStore
from tests.metadata_log.log_fixtures import change, records

MARKER = "corrupt-me-please"


def marked(i: int) -> list[MetadataRecord]:
    return [TopicRecord(name=f"{MARKER}-{i:04d}", topic_id="t", partitions=1, min_isr=1)]


def flip_byte_of(path: Path, needle: bytes) -> None:
    """Flip one bit inside the only occurrence of `needle` in the file."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0, f"{needle!r} not in {path}"
    assert data.find(needle, at + 1) == -1, f"{needle!r} occurs twice in {path}"
    data[at + len(needle) - 1] ^= 0x01
    path.write_bytes(bytes(data))


async def write_log(data_dir: Path, batches: list[list[MetadataRecord]]) -> list[range]:
    """Append each batch as its own stored batch (distinct timestamps), then close."""
    async with await SqliteLogStore.open(data_dir) as store:
        return list(
            await asyncio.gather(
                *(store.append(b, timestamp_ms=1000 + i) for i, b in enumerate(batches))
            )
        )


async def test_creates_the_log_file_in_the_data_dir_in_wal_mode(tmp_path: Path) -> None:
    data_dir = tmp_path / "data" / "nested"
    await write_log(data_dir, [records(3)])
    path = data_dir / LOG_FILE_NAME
    assert resolve_log_path(data_dir) == path
    assert resolve_log_path(path) == path
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert dict(conn.execute("SELECT key, value FROM meta"))["magic"] == "metactl-metadata-log"
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed on close


async def test_open_without_create_needs_an_existing_log(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="no metadata log at"):
        await SqliteLogStore.open(tmp_path / "missing", create=False)
    with pytest.raises(LogError, match="no metadata log at"):
        await SqliteLogStore.open(tmp_path / "missing", read_only=True)


async def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / LOG_FILE_NAME
    path.write_text("this is not a database, it is a shopping list\n" * 100)
    with pytest.raises(LogSchemaError) as raised:
        await SqliteLogStore.open(tmp_path)
    assert str(path) in str(raised.value)


async def test_another_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / LOG_FILE_NAME
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY)")
    with pytest.raises(LogSchemaError, match="no meta table") as raised:
        await SqliteLogStore.open(tmp_path)
    assert str(path) in str(raised.value)


async def test_wrong_magic_or_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    await write_log(tmp_path, [records(2)])
    path = tmp_path / LOG_FILE_NAME
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = 99 WHERE key = 'schema_version'")
    with pytest.raises(LogSchemaError, match="schema version 99") as raised:
        await SqliteLogStore.open(tmp_path)
    assert str(path) in str(raised.value)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = 1 WHERE key = 'schema_version'")
        conn.execute("UPDATE meta SET value = 'someone-else' WHERE key = 'magic'")
    with pytest.raises(LogSchemaError, match="someone-else"):
        await SqliteLogStore.open(tmp_path, read_only=True)


async def test_a_corrupt_payload_in_the_tail_fails_open_and_verify(tmp_path: Path) -> None:
    batches = [records(5, first=5 * i) for i in range(8)]
    batches[6] = marked(6)
    ranges = await write_log(tmp_path, batches)
    path = tmp_path / LOG_FILE_NAME
    flip_byte_of(path, f"{MARKER}-0006".encode())

    with pytest.raises(CorruptLogError) as raised:
        await SqliteLogStore.open(tmp_path)
    assert raised.value.path == str(path)
    assert raised.value.offset == ranges[6].start
    assert str(path) in str(raised.value) and f"offset {ranges[6].start}" in str(raised.value)

    async with await SqliteLogStore.open(tmp_path, read_only=True, verify_tail=False) as store:
        with pytest.raises(CorruptLogError) as raised:
            await store.verify()
        assert raised.value.offset == ranges[6].start
        # Records before the damage are still readable; the damaged batch is not.
        assert len(await store.read(0, max_records=ranges[6].start)) == ranges[6].start
        with pytest.raises(CorruptLogError):
            await store.read(ranges[6].start)


async def test_a_corrupt_payload_before_the_tail_is_found_by_verify_and_reads(
    tmp_path: Path,
) -> None:
    batches: list[list[MetadataRecord]] = [[change(i)] for i in range(100)]
    batches[3] = marked(3)
    await write_log(tmp_path, batches)
    flip_byte_of(tmp_path / LOG_FILE_NAME, f"{MARKER}-0003".encode())

    async with await SqliteLogStore.open(tmp_path) as store:  # the tail is fine
        assert store.end_offset == 100
        assert [e.record for e in await store.read(50, 50)] == [change(i) for i in range(50, 100)]
        with pytest.raises(CorruptLogError) as raised:
            await store.read(0)
        assert raised.value.offset == 3
        with pytest.raises(CorruptLogError) as raised:
            await store.verify()
        assert raised.value.offset == 3
        assert raised.value.path == str(tmp_path / LOG_FILE_NAME)


def rewrite_batch(path: Path, base_offset: int, payload: bytes) -> None:
    """Replace a stored batch's payload, with a CRC that matches: what a writer bug would do."""
    with sqlite3.connect(path) as conn:
        count, timestamp_ms = conn.execute(
            "SELECT record_count, timestamp_ms FROM batches WHERE base_offset = ?", (base_offset,)
        ).fetchone()
        conn.execute(
            "UPDATE batches SET payload = ?, crc = ? WHERE base_offset = ?",
            (payload, batch_crc(base_offset, count, timestamp_ms, payload), base_offset),
        )


async def test_a_tail_batch_whose_payload_holds_the_wrong_count_fails_open(
    tmp_path: Path,
) -> None:
    ranges = await write_log(tmp_path, [records(5, first=5 * i) for i in range(4)])
    path = tmp_path / LOG_FILE_NAME
    rewrite_batch(path, ranges[2].start, encode_batch(records(6)))

    with pytest.raises(CorruptLogError, match="says 5 records, payload holds 6") as raised:
        await SqliteLogStore.open(tmp_path)
    assert raised.value.offset == ranges[2].start
    assert raised.value.path == str(path)


async def test_a_tail_batch_that_does_not_decode_under_a_valid_crc_fails_reads_not_open(
    tmp_path: Path,
) -> None:
    # Opening checks the tail's CRCs and record counts but does not decode it; the first
    # read of the batch (replay, right after opening) finds it.
    ranges = await write_log(tmp_path, [records(5, first=5 * i) for i in range(4)])
    rewrite_batch(tmp_path / LOG_FILE_NAME, ranges[2].start, msgspec.msgpack.encode([7] * 5))

    async with await SqliteLogStore.open(tmp_path) as store:
        assert store.end_offset == ranges[-1].stop
        assert len(await store.read(0, max_records=ranges[2].start)) == ranges[2].start
        with pytest.raises(CorruptLogError, match="does not decode") as raised:
            await store.read(0)
        assert raised.value.offset == ranges[2].start
        with pytest.raises(CorruptLogError, match="does not decode") as raised:
            await store.verify()
        assert raised.value.offset == ranges[2].start


async def test_a_damaged_sqlite_page_is_a_corrupt_log_error(tmp_path: Path) -> None:
    await write_log(tmp_path, [records(20, first=20 * i) for i in range(50)])
    path = tmp_path / LOG_FILE_NAME
    with sqlite3.connect(path) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'batches'").fetchone()
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(path.read_bytes())
    start = (root[0] - 1) * page_size
    data[start : start + page_size] = b"\xa5" * page_size
    path.write_bytes(bytes(data))

    with pytest.raises(CorruptLogError) as raised:
        await SqliteLogStore.open(tmp_path)
    assert raised.value.path == str(path)
    assert "malformed" in str(raised.value)


async def test_disk_full_fails_the_commit_and_the_store_keeps_working(tmp_path: Path) -> None:
    async with await SqliteLogStore.open(tmp_path) as store:
        committed = await store.append(records(10))
        await store.debug_limit_pages(2)
        big: list[MetadataRecord] = [
            TopicRecord(name="x" * 2000 + str(i), topic_id="t", partitions=1, min_isr=1)
            for i in range(100)
        ]
        outcomes = await asyncio.gather(
            store.append(big), store.append(big[:50]), return_exceptions=True
        )
        for outcome in outcomes:
            assert isinstance(outcome, StorageError)
            assert not isinstance(outcome, FatalStorageError)
            assert "disk" in str(outcome) or "full" in str(outcome)
        assert store.end_offset == committed.stop

        await store.debug_limit_pages(None)
        later = await store.append([NoOpRecord(), NoOpRecord()])
        assert later == range(committed.stop, committed.stop + 2)
        entries = await store.read(0)
        assert [e.record for e in entries] == [*records(10), NoOpRecord(), NoOpRecord()]
        await store.verify()

    async with await SqliteLogStore.open(tmp_path) as store:
        assert store.end_offset == 12
        assert (await store.verify()).records == 12


async def test_only_one_writer_at_a_time(tmp_path: Path) -> None:
    async with await SqliteLogStore.open(tmp_path) as store:
        await store.append(records(1))
        with pytest.raises(LogError, match="already open for writing"):
            await SqliteLogStore.open(tmp_path)
        async with await SqliteLogStore.open(tmp_path, read_only=True) as reader:
            assert reader.end_offset == 1
            with pytest.raises(InvalidRequestError, match="read-only"):
                await reader.append(records(1))
    async with await SqliteLogStore.open(tmp_path) as store:  # the lock went with the store
        assert store.end_offset == 1


async def test_a_read_only_follower_sees_another_writers_commits(tmp_path: Path) -> None:
    async with (
        await SqliteLogStore.open(tmp_path) as writer,
        await SqliteLogStore.open(tmp_path, read_only=True) as follower,
    ):
        await writer.append(records(3))
        assert [e.offset for e in await follower.read(0)] == [0, 1, 2]  # reads refresh

        waiting = asyncio.create_task(follower.wait_for(5, timeout=30))
        await writer.append(records(2, first=3))
        assert not await follower.wait_for(5, timeout=0)
        await writer.append(records(1, first=5))
        assert await waiting
        assert [e.record for e in await follower.read(3)] == records(3, first=3)

        await writer.write_snapshot(6, {"image": 1})
        assert await writer.delete_before_snapshot() == 6
        await follower.read(6)
        assert follower.start_offset == 6


@pytest.mark.parametrize("count", [2**31, 2**40, -(2**40)])
async def test_a_crafted_record_count_is_corruption_not_a_crash(tmp_path: Path, count: int) -> None:
    """Issue 21 item 7: a record count too wide for the header's int32 made the CRC's
    struct.pack raise, and the controller exit 70 with UNKNOWN_SERVER_ERROR. In the tail
    it fails the open; before the tail (past the open's check), every read and verify."""
    ranges = await write_log(tmp_path, [records(1, first=i) for i in range(70)])
    path = tmp_path / LOG_FILE_NAME
    for where in (ranges[1].start, ranges[-1].start):
        with sqlite3.connect(path) as conn:
            conn.execute(
                "UPDATE batches SET record_count = ? WHERE base_offset = ?", (count, where)
            )
        if where == ranges[-1].start:
            with pytest.raises(CorruptLogError):
                await SqliteLogStore.open(tmp_path)
            continue
        store = await SqliteLogStore.open(tmp_path)  # the tail is sound
        try:
            with pytest.raises(CorruptLogError) as raised:
                await store.read(0)
            assert raised.value.code == "CORRUPT_MESSAGE" and raised.value.offset == where
            with pytest.raises(CorruptLogError):
                await store.verify()
        finally:
            await store.close()
