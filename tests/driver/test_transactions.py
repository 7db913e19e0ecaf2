"""The driver's transactions on a real SQLite log: a change larger than one batch commits
as several batches between begin/end markers; a crash or a failed append between them
leaves nothing of the change, and the log gets its abort marker; a topic created in
slices keeps heartbeats answered, shows nothing before its end marker, defers writes
until then, and answers only once the end marker is durable."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest

from audit.logread import iter_batches
from controller.runtime.clock import VirtualClock
from controller.runtime.driver import Controller
from controller.runtime.loading import load_image, load_log
from metactl.errors import (
    LogClosedError,
    StorageError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from metadata_image.delta import MetadataDelta
from metadata_log.records import (
    AbortTransactionRecord,
    BeginTransactionRecord,
    EndTransactionRecord,
    FenceBrokerRecord,
    MetadataRecord,
    encode_batch,
)
from metadata_log.sqlite_format import resolve_log_path
from metadata_log.sqlite_store import SqliteLogStore
from protocol.messages.admin import CreateTopic, ElectLeader
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import CreateTopicResponse, FenceBroker, UnfenceBroker
from tests.metadata_log.log_fixtures import FailingStore

LIMIT = 4096  # bytes per batch, lowered so that a 200-partition fence needs several


Keep = Callable[[SqliteLogStore], SqliteLogStore]


@pytest.fixture
async def keep() -> AsyncIterator[Keep]:
    """Registers stores to close at teardown (their controllers too), so that a failing
    assertion never leaves a store's thread running."""
    stores: list[SqliteLogStore] = []

    def register(store: SqliteLogStore) -> SqliteLogStore:
        stores.append(store)
        return store

    yield register
    for ctl in _controllers:
        with contextlib.suppress(Exception):
            await ctl.close()
    _controllers.clear()
    for store in reversed(stores):
        with contextlib.suppress(Exception):
            await store.close()


_controllers: list[Controller] = []


async def _failing(path: Path, keep: Keep) -> FailingStore:
    store = keep(await FailingStore.open(path))
    assert isinstance(store, FailingStore)
    return store


async def _cluster(ctl: Controller, brokers: Sequence[int]) -> None:
    for b in brokers:
        r = await ctl.submit(RegisterBroker(broker_id=b, incarnation_id=f"b{b}"))
        assert isinstance(r, RegisterBrokerResponse)
        await ctl.submit(UnfenceBroker(broker_id=b, broker_epoch=r.broker_epoch))


async def _open(store: SqliteLogStore, **options: int) -> Controller:
    ctl = await Controller.open(store, clock=VirtualClock(), **options)  # type: ignore[arg-type]
    _controllers.append(ctl)
    await _cluster(ctl, [1, 2, 3])
    return ctl


async def _records(store: SqliteLogStore, start: int) -> list[MetadataRecord]:
    return [e.record for e in await store.read(start, 100_000)]


def _payload_sizes(data_dir: Path, start: int) -> list[int]:
    path = resolve_log_path(data_dir)
    return [len(b[3]) for chunk in iter_batches(path, start, 1 << 62) for b in chunk]


async def test_a_fence_larger_than_a_batch_commits_as_several_batches(
    tmp_path: Path, keep: Keep
) -> None:
    store = keep(await SqliteLogStore.open(tmp_path))
    ctl = await _open(store, max_batch_bytes=LIMIT)
    await ctl.submit(CreateTopic(name="t", partitions=200, replication_factor=3, min_isr=2))
    start = store.end_offset
    told: list[tuple[int, int, MetadataDelta]] = []
    ctl.commit_listeners.append(lambda base, rs, delta, now: told.append((base, len(rs), delta)))
    await ctl.submit(FenceBroker(broker_id=1))
    records = await _records(store, start)
    assert records[0] == BeginTransactionRecord(name="FenceBroker 1")
    assert isinstance(records[1], FenceBrokerRecord)
    assert isinstance(records[-1], EndTransactionRecord)
    sizes = _payload_sizes(tmp_path, start)
    assert len(sizes) >= 3 and max(sizes) <= LIMIT
    # Listeners hear about the transaction once, whole.
    assert [(base, n) for base, n, _ in told] == [(start, len(records))]
    assert len(told[0][2].partitions) == 200
    assert ctl.committed_image.same_state(ctl.image)
    image = ctl.image
    await ctl.close()
    assert (await load_image(store)).same_state(image)
    assert image.brokers[1].fenced
    await store.close()


class _Watching(SqliteLogStore):
    """A real SQLite store that notes, per append, whether the caller handed over the
    records' encoding (and checks it is theirs)."""

    given: list[bool]

    async def append(
        self,
        records: Sequence[MetadataRecord],
        *,
        timestamp_ms: int | None = None,
        payload: bytes | None = None,
    ) -> range:
        assert payload is None or payload == encode_batch(list(records))
        self.given.append(payload is not None)
        return await super().append(records, timestamp_ms=timestamp_ms, payload=payload)


async def test_every_append_stores_the_encoding_the_controller_made(
    tmp_path: Path, keep: Keep
) -> None:
    # One encoding per change: a step's own (joined across a group commit), or for a
    # transaction split into batches, the one `split` made to fit each batch.
    store = keep(await _Watching.open(tmp_path))
    assert isinstance(store, _Watching)
    store.given = []
    ctl = await _open(store, max_batch_bytes=LIMIT)
    await ctl.submit(CreateTopic(name="t", partitions=20, replication_factor=3, min_isr=2))
    small = len(store.given)
    await ctl.submit(CreateTopic(name="u", partitions=200, replication_factor=3, min_isr=2))
    await ctl.submit(FenceBroker(broker_id=1))
    assert small >= 7 and len(store.given) >= small + 6  # the fence took several batches
    assert all(store.given), store.given


async def test_a_failed_append_between_batches_reverts_and_aborts(
    tmp_path: Path, keep: Keep
) -> None:
    store = await _failing(tmp_path, keep)
    ctl = await _open(store, max_batch_bytes=LIMIT)
    await ctl.submit(CreateTopic(name="t", partitions=200, replication_factor=3, min_isr=2))
    before, start = ctl.committed_image, store.end_offset
    store.fail_on = frozenset({store.writes + 2})  # the fence's second batch
    with pytest.raises(StorageError):
        await ctl.submit(FenceBroker(broker_id=1))
    # The begin marker and the first batch are durable; nothing of them shows.
    partial = await _records(store, start)
    assert isinstance(partial[0], BeginTransactionRecord) and len(partial) > 1
    assert not isinstance(partial[-1], EndTransactionRecord)
    assert ctl.committed_image.same_state(before)
    assert not ctl.image.brokers[1].fenced
    assert ctl.image.partitions == before.partitions
    assert ctl.image.end_offset == store.end_offset + 1  # room for the abort marker
    state = await load_log(store)
    assert state.transaction is not None and state.image.same_state(before)
    # The next append starts with the abort; the retried fence commits after it.
    await ctl.submit(FenceBroker(broker_id=1))
    records = await _records(store, start)
    aborted = len(partial)
    assert isinstance(records[aborted], AbortTransactionRecord)
    assert isinstance(records[aborted + 1], BeginTransactionRecord)
    assert isinstance(records[-1], EndTransactionRecord)
    assert ctl.image.brokers[1].fenced and ctl.committed_image.same_state(ctl.image)
    image = ctl.image
    await ctl.close()
    assert (await load_image(store)).same_state(image)
    await store.close()


async def test_a_crash_between_batches_leaves_nothing_and_reopening_aborts(
    tmp_path: Path, keep: Keep
) -> None:
    store = keep(await SqliteLogStore.open(tmp_path))
    ctl = await _open(store, max_batch_bytes=LIMIT)
    await ctl.submit(CreateTopic(name="t", partitions=200, replication_factor=3, min_isr=2))
    before = ctl.committed_image
    await ctl.submit(FenceBroker(broker_id=1))
    await ctl.close()
    await store.close()
    # The crash: the last batch (with the end marker) never reached the file.
    with sqlite3.connect(resolve_log_path(tmp_path)) as conn:
        conn.execute(
            "DELETE FROM batches WHERE base_offset = (SELECT max(base_offset) FROM batches)"
        )
    conn.close()

    store = keep(await SqliteLogStore.open(tmp_path))
    assert (await load_image(store)).same_state(before)
    end = store.end_offset
    assert end > before.end_offset + 1  # part of the transaction is in the file
    ctl = await Controller.open(store, clock=VirtualClock(), max_batch_bytes=LIMIT)
    _controllers.append(ctl)
    # Opening appended the abort marker; the image has nothing of the fence.
    (abort,) = await _records(store, end)
    assert isinstance(abort, AbortTransactionRecord) and "FenceBroker 1" in abort.reason
    assert ctl.image.end_offset == store.end_offset == end + 1
    assert not ctl.image.brokers[1].fenced
    assert ctl.image.partitions == before.partitions
    # Later records are not swallowed by the aborted transaction.
    await ctl.submit(FenceBroker(broker_id=1))
    image = ctl.image
    assert image.brokers[1].fenced
    await ctl.close()
    await store.close()
    store = keep(await SqliteLogStore.open(tmp_path))
    assert (await load_image(store)).same_state(image)
    await store.close()


async def _first_append(ctl: Controller) -> asyncio.Event:
    appended = asyncio.Event()
    ctl.append_listeners.append(lambda seconds, n: appended.set())
    return appended


async def test_a_sliced_create_keeps_answering_and_shows_nothing_partial(
    tmp_path: Path, keep: Keep
) -> None:
    store = keep(await SqliteLogStore.open(tmp_path))
    ctl = await _open(store, work_budget=25)
    start = store.end_offset
    told: list[tuple[int, int]] = []
    ctl.commit_listeners.append(lambda base, rs, delta, now: told.append((base, len(rs))))
    appended = await _first_append(ctl)
    create = asyncio.create_task(
        ctl.submit(CreateTopic(name="big", partitions=1000, replication_factor=3))
    )  # 40 slices
    await appended.wait()
    epoch = ctl.image.brokers[2].epoch
    hb = await ctl.submit(
        BrokerHeartbeatRequest(broker_id=2, broker_epoch=epoch, metadata_offset=start)
    )
    # Answered while the transaction is open; nothing of it is committed-visible.
    assert isinstance(hb, BrokerHeartbeatResponse) and not hb.is_fenced
    assert not create.done() and ctl.in_transaction
    assert "big" in ctl.image.topics and "big" not in ctl.committed_image.topics
    assert "big" not in (await load_image(store)).topics
    assert told == []  # listeners hear nothing of a transaction before its end marker
    # An event that writes nothing sees the image before the transaction...
    with pytest.raises(UnknownTopicOrPartitionError):
        await ctl.submit(ElectLeader(topic="big", partition=0, election_type="preferred"))
    # ...and one that would write is deferred until the end (then it sees the topic).
    again = asyncio.create_task(ctl.submit(CreateTopic(name="big", partitions=1)))
    answered_after: list[bool] = []  # whether the topic was durable when it was refused
    again.add_done_callback(lambda _: answered_after.append("big" in ctl.committed_image.topics))
    # A write waits for the end of the transaction; so does drain.
    fence = asyncio.create_task(ctl.submit(FenceBroker(broker_id=3)))
    drained = asyncio.create_task(ctl.drain())
    response = await create
    with pytest.raises(TopicAlreadyExistsError):
        await again
    assert answered_after == [True]
    assert isinstance(response, CreateTopicResponse) and len(response.assignments) == 1000
    # The response came after the end marker was durable: another reader sees it.
    reader = keep(await SqliteLogStore.open(tmp_path, read_only=True))
    records = [e.record for e in await reader.read(start, 100_000)]
    await reader.close()
    end = next(i for i, r in enumerate(records) if isinstance(r, EndTransactionRecord))
    assert isinstance(records[0], BeginTransactionRecord)
    assert len(ctl.committed_image.partitions) == 1000
    await fence
    await drained
    records = await _records(store, start)
    fenced_at = next(i for i, r in enumerate(records) if isinstance(r, FenceBrokerRecord))
    assert fenced_at > end  # the deferred fence was written after the end marker
    # Listeners heard the transaction at its end, slice by slice, in offset order.
    offset = start
    for base, n in told:
        assert base == offset
        offset += n
        if offset == start + end + 1:
            break
    assert offset == start + end + 1
    image = ctl.image
    await ctl.close()
    assert (await load_image(store)).same_state(image)
    await store.close()


async def test_closing_during_a_sliced_create_aborts_it(tmp_path: Path, keep: Keep) -> None:
    store = keep(await SqliteLogStore.open(tmp_path))
    ctl = await _open(store, work_budget=25)
    appended = await _first_append(ctl)
    create = asyncio.create_task(
        ctl.submit(CreateTopic(name="big", partitions=1000, replication_factor=3))
    )
    await appended.wait()
    await ctl.close()
    with pytest.raises(LogClosedError):
        await create
    last = (await _records(store, store.end_offset - 1))[-1]
    assert isinstance(last, AbortTransactionRecord)
    state = await load_log(store)
    assert state.transaction is None and "big" not in state.image.topics
    assert state.image.same_state(ctl.committed_image)
    await store.close()


async def test_a_failed_append_during_a_sliced_create_fails_it_and_aborts(
    tmp_path: Path, keep: Keep
) -> None:
    store = await _failing(tmp_path, keep)
    ctl = await _open(store, work_budget=25)
    before = ctl.committed_image
    store.fail_on = frozenset({store.writes + 3})
    request = CreateTopic(name="big", partitions=1000, replication_factor=3)
    with pytest.raises(StorageError):
        await ctl.submit(request)
    assert "big" not in ctl.image.topics and not ctl.in_transaction
    assert ctl.committed_image.same_state(before)
    # The next request starts the log with the abort, and the create can be retried.
    response = await ctl.submit(request)
    assert isinstance(response, CreateTopicResponse)
    image = ctl.image
    await ctl.close()
    state = await load_log(store)
    assert state.image.same_state(image) and len(image.partitions) == 1000
    kinds = [type(e.record).__name__ for e in await store.read(before.end_offset, 100_000)]
    assert kinds.count("AbortTransactionRecord") == 1
    assert kinds.count("BeginTransactionRecord") == 2
    await store.close()


async def test_an_answer_waiting_on_a_failed_commit_fails_with_it(
    tmp_path: Path, keep: Keep
) -> None:
    store = await _failing(tmp_path, keep)
    ctl = await _open(store)
    epoch = ctl.image.brokers[2].epoch
    beat = BrokerHeartbeatRequest(broker_id=2, broker_epoch=epoch, metadata_offset=epoch + 1)
    assert isinstance(await ctl.submit(beat), BrokerHeartbeatResponse)  # nothing to wait for
    store.fail_on = frozenset({store.writes + 1})
    fence, answer = await asyncio.gather(
        ctl.submit(FenceBroker(broker_id=3)), ctl.submit(beat), return_exceptions=True
    )
    # The heartbeat wrote nothing, but came after the fence: it fails with the fence.
    assert isinstance(fence, StorageError) and isinstance(answer, StorageError)
    assert isinstance(await ctl.submit(beat), BrokerHeartbeatResponse)
