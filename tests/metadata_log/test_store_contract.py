"""The LogStore contract, run against every backend.

`LogStoreContract` holds the tests; each backend subclass says how to open a new log and
how to reopen one. A new backend passes when a three-line subclass of it passes.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localcluster.etcd import LocalEtcd
from metactl.errors import (
    InvalidRequestError,
    LogClosedError,
    LogSchemaError,
    OffsetOutOfRangeError,
)
from metadata_log.batch_format import LogEntry
from metadata_log.etcd.store import EtcdLogStore
from metadata_log.memory_store import MemoryLogStore
from metadata_log.records import MetadataRecord, NoOpRecord, encode_batch
from metadata_log.sqlite_store import SqliteLogStore
from metadata_log.store import LogStore
from tests.metadata_log.log_fixtures import change, record_strategy, records


class State(msgspec.Struct):
    """A stand-in for the controller's image in snapshot tests."""

    brokers: dict[int, int]
    topics: list[str]


class Other(msgspec.Struct):
    unrelated: float


async def read_all(store: LogStore, start: int = 0) -> list[LogEntry]:
    return [entry async for entry in store.iter_entries(start)]


class LogStoreContract:
    """Backend-independent tests. Subclasses implement `new_store` and `reopen`."""

    tmp_path: Path
    opened: list[LogStore]
    counter: itertools.count[int]

    @pytest.fixture(autouse=True)
    async def _track_stores(self, tmp_path: Path) -> AsyncIterator[None]:
        self.tmp_path = tmp_path
        self.opened = []
        self.counter = itertools.count()
        yield
        for store in self.opened:
            await store.close()

    async def new_store(self) -> LogStore:
        raise NotImplementedError

    async def reopen(self, store: LogStore) -> LogStore:
        """Close `store` and open its log again."""
        raise NotImplementedError

    async def open(self) -> LogStore:
        store = await self.new_store()
        self.opened.append(store)
        return store

    async def reopened(self, store: LogStore) -> LogStore:
        again = await self.reopen(store)
        self.opened.append(again)
        return again

    # --- append and read ---------------------------------------------------------------------

    async def test_new_log_is_empty(self) -> None:
        store = await self.open()
        assert (store.start_offset, store.end_offset) == (0, 0)
        assert await store.read(0) == []
        assert await read_all(store) == []
        with pytest.raises(OffsetOutOfRangeError):
            await store.read(1)

    async def test_append_assigns_contiguous_offsets_and_reads_back(self) -> None:
        store = await self.open()
        first, second = records(3), records(2, first=3)
        assert await store.append(first, timestamp_ms=1_000) == range(3)
        assert await store.append(second, timestamp_ms=2_000) == range(3, 5)
        assert store.end_offset == 5
        entries = await store.read(0)
        assert [e.offset for e in entries] == [0, 1, 2, 3, 4]
        assert [e.record for e in entries] == first + second
        assert [e.timestamp_ms for e in entries] == [1_000] * 3 + [2_000] * 2
        assert entries[0].crc == entries[2].crc != entries[3].crc

    async def test_an_append_given_its_encoding_stores_it_as_given(self) -> None:
        # The controller hands over the payload its step encoded (issue 9: one encoding
        # per change): the store keeps those bytes, framed and checked as any other, and
        # does not encode the records again. Handed the encoding of other records of the
        # same count (which a caller must not do), it shows which of the two it stored.
        store = await self.open()
        batch, encoded = records(4), records(4, first=100)
        assert batch != encoded
        assert await store.append(batch, timestamp_ms=5, payload=encode_batch(encoded)) == range(4)
        entries = await store.read(0)
        assert [e.record for e in entries] == encoded
        assert (await store.verify()).records == 4

    async def test_read_bounds(self) -> None:
        store = await self.open()
        await store.append(records(10), timestamp_ms=1)
        await store.append(records(10, first=10), timestamp_ms=2)
        middle = await store.read(7, max_records=5)  # starts inside one batch, ends in the next
        assert [e.offset for e in middle] == [7, 8, 9, 10, 11]
        assert [e.record for e in middle] == records(5, first=7)
        assert [e.offset for e in await store.read(18)] == [18, 19]
        assert await store.read(20) == []
        with pytest.raises(OffsetOutOfRangeError, match="past the end"):
            await store.read(21)
        with pytest.raises(InvalidRequestError):
            await store.read(0, max_records=0)

    async def test_append_refuses_empty_and_foreign_batches(self) -> None:
        store = await self.open()
        with pytest.raises(InvalidRequestError):
            await store.append([])
        with pytest.raises(InvalidRequestError, match="not a metadata record"):
            await store.append([NoOpRecord(), State(brokers={}, topics=[])])  # type: ignore[list-item]
        with pytest.raises(InvalidRequestError):
            await store.append([NoOpRecord()], timestamp_ms=-1)
        assert store.end_offset == 0
        assert await store.append((NoOpRecord(),)) == range(1)  # any sequence will do

    async def test_timestamp_defaults_to_wall_clock(self) -> None:
        store = await self.open()
        before = time.time_ns() // 1_000_000
        await store.append([NoOpRecord()])
        after = time.time_ns() // 1_000_000
        (entry,) = await store.read(0)
        assert before <= entry.timestamp_ms <= after

    async def test_concurrent_appends_get_contiguous_offsets_in_submission_order(self) -> None:
        store = await self.open()
        batches = [records(1 + i % 4, first=100 * i) for i in range(60)]
        # Some neighbours share a timestamp, some do not: both storage paths are exercised.
        ranges = await asyncio.gather(
            *(store.append(b, timestamp_ms=i // 3) for i, b in enumerate(batches))
        )
        expected_start = 0
        for batch, offsets in zip(batches, ranges, strict=True):
            assert offsets == range(expected_start, expected_start + len(batch))
            expected_start = offsets.stop
        entries = await read_all(store)
        assert [e.record for e in entries] == [r for b in batches for r in b]
        assert [e.timestamp_ms for e in entries] == [
            i // 3 for i, b in enumerate(batches) for _ in b
        ]

    async def test_group_commit_shares_one_commit(self) -> None:
        store = await self.open()
        await store.append([NoOpRecord()])
        before = store.commits
        ranges = await asyncio.gather(*(store.append([change(i)]) for i in range(200)))
        assert sorted(r.start for r in ranges) == list(range(1, 201))
        assert store.commits - before == 1

    # --- waiting -----------------------------------------------------------------------------

    async def test_wait_for_returns_at_once_for_committed_offsets(self) -> None:
        store = await self.open()
        await store.append(records(3))
        assert await store.wait_for(0, timeout=0)
        assert await store.wait_for(2, timeout=None)

    async def test_wait_for_times_out(self) -> None:
        store = await self.open()
        await store.append(records(3))
        assert not await store.wait_for(3, timeout=0.01)
        assert not await store.wait_for(3, timeout=0)

    async def test_wait_for_wakes_when_the_offset_commits(self) -> None:
        store = await self.open()
        waiter = asyncio.create_task(store.wait_for(5, timeout=60))
        await store.append(records(5))  # offsets 0..4: not yet
        done, _ = await asyncio.wait({waiter}, timeout=0.05)
        assert not done
        await store.append(records(1))  # offset 5
        assert await waiter is True

    async def test_wait_for_raises_when_the_store_closes(self) -> None:
        store = await self.open()
        waiter = asyncio.create_task(store.wait_for(0, timeout=60))
        done, _ = await asyncio.wait({waiter}, timeout=0.01)
        assert not done
        await store.close()
        with pytest.raises(LogClosedError):
            await waiter

    # --- streaming ---------------------------------------------------------------------------

    async def test_iter_entries_streams_any_range(self) -> None:
        store = await self.open()
        expected: list[MetadataRecord] = []
        for i in range(40):
            batch = records(1 + (i * 7) % 23, first=len(expected))
            await store.append(batch, timestamp_ms=i)
            expected.extend(batch)
        total = len(expected)
        assert [e.record for e in await read_all(store)] == expected
        for lo, hi, step in [(0, total, 1), (5, 100, 7), (13, 14, 1000), (total, total, 3)]:
            got = [e async for e in store.iter_entries(lo, hi, batch=step)]
            assert [e.offset for e in got] == list(range(lo, hi))
            assert [e.record for e in got] == expected[lo:hi]
        with pytest.raises(OffsetOutOfRangeError):
            _ = [e async for e in store.iter_entries(0, total + 1)]

    async def test_iter_chunks_are_bounded(self) -> None:
        store = await self.open()
        for i in range(30):
            await store.append(records(10, first=10 * i), timestamp_ms=i)
        sizes = [len(chunk) async for chunk in store.iter_chunks(0, batch=25)]
        assert sum(sizes) == 300
        assert max(sizes) <= 25 + 10  # at most one stored batch beyond the request

    async def test_iteration_stops_at_the_end_seen_when_it_started(self) -> None:
        store = await self.open()
        await store.append(records(10))
        seen = []
        async for entry in store.iter_entries(0, batch=3):
            seen.append(entry.offset)
            if entry.offset == 0:
                await store.append(records(5))
        assert seen == list(range(10))

    # --- durability across reopen --------------------------------------------------------------

    async def test_reopen_keeps_everything(self) -> None:
        store = await self.open()
        await store.append(records(7), timestamp_ms=5)
        await store.append(records(3, first=7), timestamp_ms=6)
        await store.write_snapshot(7, State(brokers={1: 0}, topics=["a"]))
        before = await read_all(store)
        again = await self.reopened(store)
        assert (again.start_offset, again.end_offset) == (0, 10)
        assert await read_all(again) == before
        assert await again.load_snapshot(State) == (7, State(brokers={1: 0}, topics=["a"]))
        assert await again.append(records(1)) == range(10, 11)
        assert (await again.verify()).records == 11

    # --- snapshots ---------------------------------------------------------------------------

    async def test_snapshots_write_load_newest(self) -> None:
        store = await self.open()
        assert await store.load_snapshot(State) is None
        assert await store.snapshot_offsets() == []
        await store.append(records(10))
        await store.write_snapshot(3, State(brokers={1: 3}, topics=[]))
        await store.write_snapshot(7, State(brokers={1: 7}, topics=["t"]))
        await store.write_snapshot(0, State(brokers={}, topics=[]))
        assert await store.snapshot_offsets() == [0, 3, 7]
        assert await store.load_snapshot(State) == (7, State(brokers={1: 7}, topics=["t"]))
        await store.write_snapshot(7, State(brokers={1: 77}, topics=[]))  # replaces
        assert await store.load_snapshot(State) == (7, State(brokers={1: 77}, topics=[]))

    async def test_snapshot_offset_must_be_in_the_log(self) -> None:
        store = await self.open()
        await store.append(records(4))
        await store.write_snapshot(4, State(brokers={}, topics=[]))  # the end is fine
        with pytest.raises(OffsetOutOfRangeError):
            await store.write_snapshot(5, State(brokers={}, topics=[]))
        with pytest.raises(InvalidRequestError):
            await store.write_snapshot(2, object())
        with pytest.raises(LogSchemaError, match="does not decode as Other"):
            await store.load_snapshot(Other)

    async def test_delete_before_snapshot_only_on_request(self) -> None:
        store = await self.open()
        for i in range(10):
            await store.append(records(10, first=10 * i), timestamp_ms=i)
        await store.write_snapshot(50, State(brokers={}, topics=["x"]))
        # Writing a snapshot deletes nothing.
        assert store.start_offset == 0
        assert len(await store.read(0, max_records=100)) == 100

        assert await store.delete_before_snapshot() == 50
        assert (store.start_offset, store.end_offset) == (50, 100)
        with pytest.raises(OffsetOutOfRangeError, match="snapshot"):
            await store.read(0)
        with pytest.raises(OffsetOutOfRangeError):
            await store.read(49)
        with pytest.raises(OffsetOutOfRangeError):
            _ = [e async for e in store.iter_entries(0)]
        assert [e.record for e in await read_all(store, 50)] == records(50, first=50)
        assert await store.delete_before_snapshot() == 0  # nothing left before it

        again = await self.reopened(store)
        assert (again.start_offset, again.end_offset) == (50, 100)
        with pytest.raises(OffsetOutOfRangeError):
            await again.read(10)
        assert await again.load_snapshot(State) == (50, State(brokers={}, topics=["x"]))
        assert (await again.verify()).records == 50

    async def test_delete_keeps_the_batch_holding_the_snapshot_offset(self) -> None:
        store = await self.open()
        for i in range(4):
            await store.append(records(10, first=10 * i), timestamp_ms=i)
        await store.write_snapshot(25, State(brokers={}, topics=[]))
        assert await store.delete_before_snapshot(25) == 20
        assert store.start_offset == 20
        assert [e.offset for e in await store.read(20, 100)] == list(range(20, 40))

    async def test_delete_is_refused_without_a_covering_snapshot(self) -> None:
        store = await self.open()
        await store.append(records(20))
        with pytest.raises(InvalidRequestError, match="no snapshot"):
            await store.delete_before_snapshot()
        await store.write_snapshot(10, State(brokers={}, topics=[]))
        with pytest.raises(InvalidRequestError, match="no snapshot at or after offset 15"):
            await store.delete_before_snapshot(15)
        assert store.start_offset == 0
        assert len(await store.read(0, 100)) == 20

    async def test_delete_everything_then_append(self) -> None:
        store = await self.open()
        await store.append(records(5))
        await store.write_snapshot(5, State(brokers={}, topics=[]))
        assert await store.delete_before_snapshot() == 5
        assert (store.start_offset, store.end_offset) == (5, 5)
        assert await store.read(5) == []
        assert await store.append(records(2)) == range(5, 7)
        again = await self.reopened(store)
        assert (again.start_offset, again.end_offset) == (5, 7)

    # --- close -------------------------------------------------------------------------------

    async def test_close_finishes_submitted_appends_then_refuses(self) -> None:
        store = await self.open()
        *ranges, _ = await asyncio.gather(
            *(store.append([change(i)]) for i in range(20)), store.close()
        )
        assert [r.start for r in ranges] == list(range(20))
        assert store.closed
        with pytest.raises(LogClosedError):
            await store.append([NoOpRecord()])
        with pytest.raises(LogClosedError):
            await store.read(0)
        with pytest.raises(LogClosedError):
            await store.wait_for(20)
        await store.close()  # idempotent
        again = await self.reopened(store)
        assert [e.record for e in await read_all(again)] == [change(i) for i in range(20)]

    async def test_verify_counts_a_good_log(self) -> None:
        store = await self.open()
        await store.append(records(4), timestamp_ms=1)
        await store.append(records(6), timestamp_ms=2)
        await store.write_snapshot(4, State(brokers={}, topics=[]))
        report = await store.verify()
        assert (report.start_offset, report.end_offset, report.records) == (0, 10, 10)
        assert report.batches == 2
        assert report.snapshot_offsets == [4]

    # --- property ----------------------------------------------------------------------------

    @settings(
        max_examples=40,
        deadline=None,
        # Each backend subclass runs this method as a different executor, on purpose.
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.differing_executors,
        ],
    )
    @given(
        batches=st.lists(
            st.tuples(st.lists(record_strategy, min_size=1, max_size=12), st.integers(0, 3)),
            min_size=1,
            max_size=8,
        ),
        concurrent=st.booleans(),
    )
    def test_random_batches_read_back_equal(
        self, batches: list[tuple[list[MetadataRecord], int]], concurrent: bool
    ) -> None:
        async def scenario() -> None:
            store = await self.new_store()
            try:
                if concurrent:
                    await asyncio.gather(*(store.append(b, timestamp_ms=ts) for b, ts in batches))
                else:
                    for b, ts in batches:
                        await store.append(b, timestamp_ms=ts)
                expected = [(r, ts) for b, ts in batches for r in b]
                got = await read_all(store)
                assert [(e.record, e.timestamp_ms) for e in got] == expected
                assert [e.offset for e in got] == list(range(len(expected)))
                again = await self.reopen(store)
                store = again
                assert await read_all(again) == got
            finally:
                await store.close()

        asyncio.run(scenario())


class TestMemoryLogStore(LogStoreContract):
    async def new_store(self) -> LogStore:
        return MemoryLogStore()

    async def reopen(self, store: LogStore) -> LogStore:
        assert isinstance(store, MemoryLogStore)
        await store.close()
        return MemoryLogStore(store.storage)


class TestSqliteLogStore(LogStoreContract):
    async def new_store(self) -> LogStore:
        return await SqliteLogStore.open(self.tmp_path / f"log-{next(self.counter)}")

    async def reopen(self, store: LogStore) -> LogStore:
        assert isinstance(store, SqliteLogStore)
        await store.close()
        return await SqliteLogStore.open(store.path)


class TestEtcdLogStore(LogStoreContract):
    """The same contract on a real etcd member (one per run), a key prefix per log."""

    @pytest.fixture(autouse=True)
    def _etcd(self, etcd: LocalEtcd, request: pytest.FixtureRequest) -> None:
        self.etcd = etcd
        self.prefix = f"contract/{request.node.name}/{uuid.uuid4().hex[:8]}"

    async def new_store(self) -> LogStore:
        return await EtcdLogStore.open(self.etcd.url(f"{self.prefix}/log-{next(self.counter)}"))

    async def reopen(self, store: LogStore) -> LogStore:
        assert isinstance(store, EtcdLogStore)
        await store.close()
        return await EtcdLogStore.open(store.location)
