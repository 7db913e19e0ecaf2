"""The tail cache (`metadata_log.reads`): reads of what was just committed are served from
the batches the writer kept, give what the medium gives, and the cache stays bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metactl.errors import CorruptLogError, OffsetOutOfRangeError
from metadata_log import reads
from metadata_log.backends import open_store
from metadata_log.batch_format import StoredBatch
from metadata_log.memory_store import MemoryLogStore
from metadata_log.records import NoOpRecord
from tests.metadata_log.log_fixtures import change, records


class CountingStore(MemoryLogStore):
    """A memory store that counts the reads reaching its medium."""

    def __init__(self) -> None:
        super().__init__()
        self.fetches = 0

    async def _fetch_batches(self, from_offset: int, upper: int) -> list[StoredBatch]:
        self.fetches += 1
        return await super()._fetch_batches(from_offset, upper)


async def test_a_read_of_the_tail_is_served_from_the_cache_as_the_medium_would() -> None:
    store = CountingStore()
    for i in range(10):
        await store.append([change(i), change(i + 100)])
    from_cache = await store.read(14)
    also = await store.read(3, max_records=5)
    assert store.fetches == 0
    store._recent.clear()
    assert await store.read(14) == from_cache
    assert await store.read(3, max_records=5) == also
    assert store.fetches == 2
    assert [e.offset for e in from_cache] == [14, 15, 16, 17, 18, 19]
    await store.close()


async def test_group_commits_are_cached_and_reads_past_the_cache_reach_the_medium() -> None:
    store = CountingStore()
    await asyncio.gather(*(store.append([change(i)]) for i in range(20)))  # one group
    for _ in range(reads.TAIL_CACHE_BATCHES + 5):
        await store.append([NoOpRecord()])
    assert len(store._recent) == reads.TAIL_CACHE_BATCHES
    tail = await store.read(store.end_offset - 3)
    assert store.fetches == 0
    head = await store.read(0, max_records=30)  # before the cache: the medium
    assert store.fetches == 1
    assert [e.offset for e in tail] == [store.end_offset - 3 + i for i in range(3)]
    assert [e.offset for e in head] == list(range(30))
    await store.close()


async def test_the_cache_is_bounded_in_bytes_and_skips_a_batch_over_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = CountingStore()
    await store.append(records(3))
    size = len(store._recent[-1].payload)
    monkeypatch.setattr(reads, "TAIL_CACHE_BYTES", 3 * size)
    for _ in range(5):
        await store.append(records(3))
    assert store._recent_bytes == sum(len(b.payload) for b in store._recent) <= 3 * size
    assert len(store._recent) == 3
    await store.append(records(40))  # larger than the bound: not kept, the cache restarts
    assert not store._recent and store._recent_bytes == 0
    await store.append(records(1))
    assert [b.base_offset for b in store._recent] == [store.end_offset - 1]
    assert [e.offset for e in await store.read(store.end_offset - 41)] == list(
        range(store.end_offset - 41, store.end_offset)
    )
    assert store.fetches == 1
    await store.close()


async def test_batches_that_do_not_follow_the_cache_replace_it() -> None:
    store = CountingStore()
    await store.append(records(4))
    kept = list(store._recent)
    stray = StoredBatch(base_offset=100, count=1, timestamp_ms=0, crc=0, payload=b"")
    store._remember([stray])
    assert list(store._recent) == [stray]
    store._remember(kept)
    assert list(store._recent) == kept
    await store.close()


async def test_a_cached_batch_is_checked_as_a_stored_one() -> None:
    store = CountingStore()
    await store.append(records(2))
    good = store._recent[-1]
    store._recent[-1] = StoredBatch(
        good.base_offset, good.count, good.timestamp_ms, good.crc ^ 1, good.payload
    )
    with pytest.raises(CorruptLogError):
        await store.read(0)
    await store.close()


async def test_reads_before_the_start_are_refused_though_cached(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "log")
    await store.append(records(3))
    await store.write_snapshot(3, {"state": 1})
    await store.append(records(2))
    await store.delete_before_snapshot()
    assert store.start_offset == 3
    with pytest.raises(OffsetOutOfRangeError):
        await store.read(0)
    tail = await store.read(3)
    await store.close()
    reopened = await open_store(tmp_path / "log")  # no cache: read from the file
    assert await reopened.read(3) == tail
    await reopened.close()
