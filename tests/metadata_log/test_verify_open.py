"""Opening with `verify_all=True` (`controller serve --verify-log full`), and the store's
count of failed appends (`metactl_log_append_failures_total`), on real SQLite files."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from metactl.errors import CorruptLogError, FatalStorageError, StorageError
from metadata_log import store as log_store
from metadata_log.records import MetadataRecord, NoOpRecord, TopicRecord
from metadata_log.sqlite_format import LOG_FILE_NAME
from metadata_log.sqlite_store import SqliteLogStore
from tests.metadata_log.log_fixtures import change
from tests.metadata_log.test_sqlite_store import write_log
from tests.metadata_log.test_store_internals import FlakyStore


def corrupt_payload(path: Path, base_offset: int) -> None:
    """Flip one bit of a stored batch's payload in place (its CRC no longer matches)."""
    with sqlite3.connect(path) as conn:
        (payload,) = conn.execute(
            "SELECT payload FROM batches WHERE base_offset = ?", (base_offset,)
        ).fetchone()
        damaged = bytearray(payload)
        damaged[len(damaged) // 2] ^= 0x01
        conn.execute(
            "UPDATE batches SET payload = ? WHERE base_offset = ?", (bytes(damaged), base_offset)
        )


async def test_verify_all_logs_progress_and_a_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_log(tmp_path, [[change(i)] for i in range(300)])  # 300 batches, 5 chunks
    monkeypatch.setattr(log_store, "VERIFY_PROGRESS_S", 0.0)  # a line per chunk
    with capture_logs() as logs:
        store = await SqliteLogStore.open(tmp_path, verify_all=True)
    await store.close()
    events = [e for e in logs if e["event"].startswith(("verifying", "metadata log verified"))]
    assert events[0]["event"] == "verifying the whole metadata log"
    assert events[0]["end_offset"] == 300
    progress = [e for e in events if e["event"] == "verifying the metadata log"]
    assert [e["offset"] for e in progress] == [64, 128, 192, 256, 300]
    assert progress[-1]["percent"] == 100.0
    done = events[-1]
    assert done["event"] == "metadata log verified"
    assert (done["batches"], done["records"]) == (300, 300)


async def test_verify_all_finds_an_early_corrupt_batch_that_the_tail_check_misses(
    tmp_path: Path,
) -> None:
    await write_log(tmp_path, [[change(i)] for i in range(100)])
    path = tmp_path / LOG_FILE_NAME
    corrupt_payload(path, 3)  # before the last TAIL_CHECK_BATCHES (64) batches

    async with await SqliteLogStore.open(tmp_path) as store:  # the tail check passes
        assert store.end_offset == 100
    with capture_logs() as logs, pytest.raises(CorruptLogError) as raised:
        await SqliteLogStore.open(tmp_path, verify_all=True)
    assert (raised.value.path, raised.value.offset) == (str(path), 3)
    assert f"{path} at offset 3" in str(raised.value)
    # The store reports nothing itself: the caller prints the one line.
    assert not [e for e in logs if e["log_level"] in ("warning", "error")]
    # It closed what it opened: the writer lock is free again.
    async with await SqliteLogStore.open(tmp_path) as store:
        assert store.end_offset == 100


async def test_verify_all_on_a_new_log(tmp_path: Path) -> None:
    async with await SqliteLogStore.open(tmp_path / "new", verify_all=True) as store:
        assert store.end_offset == 0
        assert await store.append([NoOpRecord()]) == range(1)


async def test_disk_full_appends_are_counted(tmp_path: Path) -> None:
    async with await SqliteLogStore.open(tmp_path) as store:
        await store.append([NoOpRecord()])
        assert store.append_failures == 0
        await store.debug_limit_pages(0)  # SQLite fails writes with SQLITE_FULL
        big: list[MetadataRecord] = [
            TopicRecord(name="x" * 2000 + str(i), topic_id="t", partitions=1, min_isr=1)
            for i in range(50)
        ]
        outcomes = await asyncio.gather(
            store.append(big), store.append(big), store.append(big), return_exceptions=True
        )
        assert all(type(o) is StorageError for o in outcomes), outcomes
        assert store.append_failures == 3
        assert store.end_offset == 1
        await store.debug_limit_pages(None)
        assert await store.append(big[:1]) == range(1, 2)
        assert store.append_failures == 3  # a success does not count


async def test_refused_appends_are_not_storage_failures(tmp_path: Path) -> None:
    async with await SqliteLogStore.open(tmp_path) as store:
        with pytest.raises(Exception, match="at least one record"):
            await store.append([])
        assert store.append_failures == 0


async def test_after_a_fatal_failure_every_append_counts() -> None:
    store = FlakyStore()
    await store.append([NoOpRecord()])
    store.fail_next = FatalStorageError("fsync failed (simulated)")
    for _ in range(3):
        with pytest.raises(FatalStorageError):
            await store.append([NoOpRecord()])
    assert store.append_failures == 3
    await store.close()
