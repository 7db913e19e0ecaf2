"""LogStore behaviour that needs a misbehaving medium, plus the helpers it is built from."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metactl.errors import CorruptLogError, FatalStorageError, StorageError
from metadata_log.backends import open_store
from metadata_log.batch_format import StoredBatch, batch_crc, check_batch_frame, concat_batches
from metadata_log.group_commit import MERGED_BATCH_RECORDS
from metadata_log.memory_store import MemoryLogStore, MemoryStorage
from metadata_log.records import MetadataRecord, NoOpRecord, decode_batch, encode_batch
from metadata_log.sqlite_store import SqliteLogStore
from tests.metadata_log.log_fixtures import change, records


class FlakyStore(MemoryLogStore):
    """A memory store whose next commit fails with a chosen exception."""

    def __init__(self, storage: MemoryStorage | None = None) -> None:
        super().__init__(storage)
        self.fail_next: BaseException | None = None

    async def _write_batches(self, batches: list[StoredBatch]) -> None:
        if self.fail_next is not None:
            failure, self.fail_next = self.fail_next, None
            raise failure
        await super()._write_batches(batches)


async def test_a_storage_error_fails_the_whole_group_and_the_store_goes_on() -> None:
    store = FlakyStore()
    await store.append(records(2))
    store.fail_next = StorageError("disk full (simulated)")
    outcomes = await asyncio.gather(
        *(store.append([change(i)]) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(o, StorageError) for o in outcomes)
    assert len({id(o) for o in outcomes}) == 5  # one exception object per caller
    assert store.end_offset == 2
    assert await store.append([NoOpRecord()]) == range(2, 3)
    assert [e.offset for e in await store.read(0)] == [0, 1, 2]
    await store.close()


@pytest.mark.parametrize(
    "failure", [FatalStorageError("fsync failed (simulated)"), RuntimeError("a bug")]
)
async def test_a_fatal_failure_stops_writes_until_reopened(failure: BaseException) -> None:
    store = FlakyStore()
    await store.append(records(2))
    store.fail_next = failure
    with pytest.raises(FatalStorageError):
        await store.append([NoOpRecord()])
    with pytest.raises(FatalStorageError, match="reopen"):
        await store.append([NoOpRecord()])
    assert [e.offset for e in await store.read(0)] == [0, 1]  # reads still work
    await store.close()
    again = MemoryLogStore(store.storage)
    assert await again.append([NoOpRecord()]) == range(2, 3)
    await again.close()


@pytest.mark.parametrize("sizes", [[1], [3, 4], [15, 1], [16, 20], [1, 70_000], [65_535, 1]])
def test_concat_batches_is_encoding_the_records_together(sizes: list[int]) -> None:
    parts: list[list[MetadataRecord]] = [[NoOpRecord()] * n for n in sizes]
    parts[0] = [change(0), *parts[0][1:]]
    joined = concat_batches([encode_batch(p) for p in parts], sum(sizes))
    assert joined == encode_batch([r for p in parts for r in p])
    assert len(decode_batch(joined)) == sum(sizes)


@pytest.mark.parametrize("count", [1, 15, 16, 65_535, 65_536])
def test_check_batch_frame_reads_the_record_count_without_decoding(count: int) -> None:
    def stored(payload: bytes, count: int = count) -> StoredBatch:
        return StoredBatch(10, count, 5, batch_crc(10, count, 5, payload), payload)

    payload = encode_batch([NoOpRecord()] * count)
    check_batch_frame(stored(payload), "here")
    with pytest.raises(CorruptLogError, match=f"says {count + 1} records, payload holds {count}"):
        check_batch_frame(stored(payload, count + 1), "here")
    with pytest.raises(CorruptLogError, match="CRC mismatch"):
        check_batch_frame(StoredBatch(10, count, 5, 0, payload), "here")
    for not_an_array in (b"", b"\xc0", payload[:2] if count >= 16 else b"\xdc"):
        with pytest.raises(CorruptLogError, match="not a MessagePack array") as raised:
            check_batch_frame(stored(not_an_array), "here")
        assert raised.value.offset == 10


async def test_open_store_understands_paths_and_urls(tmp_path: Path) -> None:
    memory = await open_store("memory:")
    assert isinstance(memory, MemoryLogStore)
    await memory.close()
    for target in (tmp_path / "a", f"sqlite://{tmp_path / 'b'}", f"sqlite:{tmp_path / 'c'}"):
        store = await open_store(target)
        assert isinstance(store, SqliteLogStore)
        await store.append([NoOpRecord()])
        await store.close()
    assert names_in(tmp_path) == ["a", "b", "c"]


def names_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def test_a_group_commit_merges_same_timestamp_appends_into_capped_batches() -> None:
    store = MemoryLogStore()
    ranges = await asyncio.gather(
        *(store.append([change(i)], timestamp_ms=7) for i in range(3000)),
        store.append([NoOpRecord()], timestamp_ms=8),
    )
    assert [r.start for r in ranges] == list(range(3001))
    assert store.commits == 1
    stored = store.storage.batches
    assert [b.count for b in stored] == [MERGED_BATCH_RECORDS] * 2 + [3000 - 2048, 1]
    assert [e.record for e in await store.read(1020, 10)] == [change(i) for i in range(1020, 1030)]
    await store.close()


def test_a_group_commit_may_not_exceed_what_one_append_may_hold() -> None:
    """Merged appends form one stored batch: a backend whose group commits could be
    larger than its append limit is refused when the store is built."""

    class Misconfigured(MemoryLogStore):
        max_batch_bytes = 1000
        group_commit_bytes = 1001

    with pytest.raises(ValueError, match="exceeds max_batch_bytes"):
        Misconfigured()
